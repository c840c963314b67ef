#include "dist/comm_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>

namespace mf {
namespace {

template <class F>
double best_of(int iters, DataParallel& g, F f) {
  double best = 1e30;
  for (int i = 0; i < iters; ++i) {
    g.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Rank `from` sends 1 + from + 2 * to rows of value 100 * from + to to rank `to`.
int64_t rows_sent(int from, int to) { return 1 + from + 2 * to; }

void check_all_to_all(DataParallel& g) {
  const int W = g.world(), me = g.rank();
  std::vector<int64_t> in_rows, out_rows;
  std::vector<at::Tensor> parts;
  for (int to = 0; to < W; ++to) {
    in_rows.push_back(rows_sent(me, to));
    parts.push_back(at::full({rows_sent(me, to), 3}, 100.0 * me + to));
  }
  for (int from = 0; from < W; ++from) out_rows.push_back(rows_sent(from, me));
  auto in = at::cat(parts);
  auto out = at::empty({std::accumulate(out_rows.begin(), out_rows.end(), int64_t{0}), 3});
  g.all_to_all(out, in, out_rows, in_rows);
  int64_t row = 0;
  for (int from = 0; from < W; ++from)
    for (int64_t i = 0; i < out_rows[from]; ++i, ++row)
      if (!out[row].eq(100.0 * from + me).all().item<bool>())
        throw std::runtime_error(fmt::format("all-to-all: rank {} row {} holds {} (expected {} from rank {})", me, row,
                                             out[row][0].item<double>(), 100.0 * from + me, from));
}

}  // namespace

double expert_parallel_bytes(int64_t tokens, int64_t d, int64_t top_k, int64_t ranks) {
  const double remote = static_cast<double>(ranks - 1) / static_cast<double>(ranks);         // pairs on other ranks
  return 4.0 * static_cast<double>(tokens * top_k) * remote * static_cast<double>(d) * 4.0;  // 4 exchanges, fp32
}

std::vector<CommBenchRow> bench_comm(DataParallel& g, const CommBenchOptions& opt) {
  check_all_to_all(g);
  std::vector<CommBenchRow> rows;
  const int W = g.world();
  for (int64_t mb : {1, 16, 64}) {
    std::vector<at::Tensor> t = {at::ones({mb * (1 << 18)})};  // mb MB of float32
    CommBenchRow r{fmt::format("all-reduce {} MB", mb)};
    r.seconds = best_of(opt.iters, g, [&] { g.sum(t); });
    r.bytes = 2.0 * (W - 1) / W * static_cast<double>(t[0].numel() * 4);  // ring: what each rank sends
    r.gbs = r.bytes / r.seconds / 1e9;
    rows.push_back(r);
  }
  // MoE dispatch: every token's k rows, spread evenly over the ranks (the share for oneself stays)
  const int64_t pairs = opt.tokens * opt.top_k;
  // the remainder of an uneven split stays with the sender: then what rank q sends to rank r is
  // what r expects from q (a remainder sent to rank 0 by everyone would not be)
  std::vector<int64_t> split(static_cast<size_t>(W), pairs / W);
  split[static_cast<size_t>(g.rank())] += pairs - (pairs / W) * W;
  auto in = at::randn({pairs, opt.d}), out = at::empty({pairs, opt.d});
  CommBenchRow r{fmt::format("all-to-all: {} tokens x top-{} x d {}", opt.tokens, opt.top_k, opt.d)};
  r.seconds = best_of(opt.iters, g, [&] { g.all_to_all(out, in, split, split); });
  r.bytes = static_cast<double>(pairs - split[static_cast<size_t>(g.rank())]) * static_cast<double>(opt.d) * 4.0;
  r.gbs = r.bytes / r.seconds / 1e9;
  rows.push_back(r);
  return rows;
}

}  // namespace mf
