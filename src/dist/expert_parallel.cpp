#include "dist/expert_parallel.h"

#include <fmt/format.h>
#include <torch/autograd.h>

#include <numeric>
#include <set>

#include "core/config.h"
#include "moe/combine.h"
#include "moe/dispatch.h"
#include "moe/routers.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t total(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, DataParallel* group,
                            const std::vector<int64_t>& out_rows, const std::vector<int64_t>& in_rows) {
    ctx->saved_data["out_rows"] = c10::IValue(out_rows);
    ctx->saved_data["in_rows"] = c10::IValue(in_rows);
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    auto in = rows.contiguous();
    auto out = at::empty({total(out_rows), rows.size(1)}, rows.options());
    group->all_to_all(out, in, out_rows, in_rows);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* group = reinterpret_cast<DataParallel*>(ctx->saved_data["group"].toInt());
    const auto out_rows = ctx->saved_data["out_rows"].toIntVector();
    const auto in_rows = ctx->saved_data["in_rows"].toIntVector();
    auto dout = grads[0].contiguous();
    auto din = at::empty({total(in_rows), dout.size(1)}, dout.options());
    group->all_to_all(din, dout, in_rows, out_rows);  // the way back: splits swapped
    return {din, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor exchange_rows(DataParallel& group, const at::Tensor& rows, const std::vector<int64_t>& out_rows,
                         const std::vector<int64_t>& in_rows) {
  return ExchangeRows::apply(rows, &group, out_rows, in_rows);
}

std::vector<at::Tensor> shard_bank(ExpertBank& bank, int rank, int world) {
  const int64_t E = bank.num_units();
  if (E % world != 0)
    throw ConfigError(fmt::format(
        "expert parallel: {} experts do not split evenly over WORLD_SIZE = {} ranks (model.moe.num_experts, or "
        "the UniPool pool size, must be a multiple of it)",
        E, world));
  const int64_t L = E / world;
  std::vector<at::Tensor> kept;
  torch::NoGradGuard no_grad;
  for (auto& p : bank.parameters()) {
    TORCH_CHECK(p.size(0) == E, "shard_bank: a parameter of ", p.size(0), " rows in a bank of ", E, " experts");
    p.set_data(p.narrow(0, rank * L, L).clone());
    kept.push_back(p);
  }
  return kept;
}

ExpertParallelBank::ExpertParallelBank(std::shared_ptr<ExpertBank> bank, DataParallel& group)
    : bank_(std::move(bank)), group_(group), owned_(bank_->num_units() / group.world()) {
  TORCH_CHECK(owned_ * group.world() == bank_->num_units() && bank_->down_proj.size(0) == owned_,
              "ExpertParallelBank: the bank must hold this rank's ", owned_, " experts (shard_bank)");
}

at::Tensor ExpertParallelBank::forward_unit(int64_t unit, const at::Tensor& rows) {
  TORCH_CHECK(unit >= first_owned() && unit < first_owned() + owned_, "expert parallel: expert ", unit,
              " lives on another rank");
  return bank_->forward_unit(unit - first_owned(), rows);
}

// rows_PD sorted by expert (counts_E of each) -> the experts' outputs in the same order.
at::Tensor ExpertParallelBank::forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) {
  const int W = group_.world();
  const int64_t U = owned_;
  auto sent_E = counts_E.to(at::kCPU, at::kLong).contiguous();
  // what each rank will receive, per source rank and owned expert: [W, U]
  auto got_WU = at::empty({W * U}, sent_E.options());
  group_.all_to_all(got_WU, sent_E, std::vector<int64_t>(W, U), std::vector<int64_t>(W, U));
  got_WU = got_WU.view({W, U});
  const auto sent_W = sent_E.view({W, U}).sum(1), got_W = got_WU.sum(1);
  const std::vector<int64_t> in_rows(sent_W.data_ptr<int64_t>(), sent_W.data_ptr<int64_t>() + W);
  const std::vector<int64_t> out_rows(got_W.data_ptr<int64_t>(), got_W.data_ptr<int64_t>() + W);
  auto received = exchange_rows(group_, rows_PD, out_rows, in_rows);  // by source rank, then expert

  // regroup by owned expert: the i-th row of the local batch is received row order[i], and
  // received row j is local row place[j]
  const int64_t P = received.size(0);
  const auto* got = got_WU.data_ptr<int64_t>();
  auto order_P = at::empty({P}, sent_E.options()), place_P = at::empty({P}, sent_E.options());
  auto *order = order_P.data_ptr<int64_t>(), *place = place_P.data_ptr<int64_t>();
  std::vector<int64_t> start(W * U);
  for (int64_t i = 0, off = 0; i < W * U; off += got[i], ++i) start[i] = off;
  int64_t i = 0;
  for (int64_t u = 0; u < U; ++u)
    for (int q = 0; q < W; ++q)
      for (int64_t j = 0; j < got[q * U + u]; ++j, ++i) place[order[i] = start[q * U + u] + j] = i;
  auto out_local = bank_->forward_grouped(gather_rows(received, order_P), got_WU.sum(0));
  auto back = gather_rows(out_local, place_P);  // received order again
  return exchange_rows(group_, back, in_rows, out_rows);
}

double check_expert_parallel(DataParallel& group, int64_t tokens) {
  const int W = group.world();
  const int64_t E = 2 * W, D = 6, F = 5, T = tokens;
  torch::manual_seed(11);  // the same layer and tokens on every rank
  auto bank = std::make_shared<ExpertBank>(E, D, F);
  bank->to(torch::kFloat64);
  RouterOptions o;
  o.num_experts = E;
  o.top_k = 2;
  Router router(D, o);
  router->to(torch::kFloat64);
  auto x_all = torch::randn({W * T, D}, torch::kFloat64), up_all = torch::randn({W * T, D}, torch::kFloat64);
  auto run = [&](const at::Tensor& x_in, const at::Tensor& up, UnitBank& units) {
    for (auto& p : bank->parameters()) p.mutable_grad() = at::Tensor();
    auto x = x_in.clone().requires_grad_(true);
    auto y = dispatch(x, router->forward(x).assignment, units).y_TD;
    (y * up).sum().backward();
    at::Tensor y_eval;  // evaluation: no grad, the exchange all the same
    {
      torch::NoGradGuard no_grad;
      y_eval = dispatch(x_in, router->forward(x_in).assignment, units).y_TD;
    }
    return std::vector<at::Tensor>{y.detach(), x.grad(), bank->gate_up_proj.grad().clone(),
                                   bank->down_proj.grad().clone(), y_eval};
  };
  const auto mine = at::arange(group.rank() * T, (group.rank() + 1) * T, at::kLong);
  auto ref = run(x_all, up_all, *bank);
  at::Tensor expert0;  // expert 0 (rank 0's) on the first T tokens
  {
    torch::NoGradGuard no_grad;
    expert0 = bank->forward_unit(0, x_all.narrow(0, 0, T));
  }
  shard_bank(*bank, group.rank(), W);
  ExpertParallelBank ep(bank, group);
  auto got = run(x_all.index_select(0, mine), up_all.index_select(0, mine), ep);
  const int64_t first = ep.first_owned(), L = ep.owned();
  const std::vector<std::pair<const char*, std::pair<at::Tensor, at::Tensor>>> pairs = {
      {"output", {got[0], ref[0].index_select(0, mine)}},
      {"input gradient", {got[1], ref[1].index_select(0, mine)}},
      {"gate_up_proj gradient", {got[2], ref[2].narrow(0, first, L)}},
      {"down_proj gradient", {got[3], ref[3].narrow(0, first, L)}},
      {"evaluation output", {got[4], ref[4].index_select(0, mine)}}};
  double worst = 0;
  {  // rank 0 routes no tokens at all; the others send all of theirs to expert 0 (rank 0's)
    auto none = at::zeros({E}, at::kLong), all = none.clone();
    all[0] = T;
    auto rows = (group.rank() == 0 ? x_all.narrow(0, 0, 0) : x_all.narrow(0, 0, T)).clone().requires_grad_(true);
    auto y = ep.forward_grouped(rows, group.rank() == 0 ? none : all);
    y.sum().backward();
    if (!y.sizes().equals(rows.sizes()) || (rows.size(0) > 0 && !at::allclose(y.detach(), expert0, 1e-12, 1e-12)))
      throw std::runtime_error(
          fmt::format("expert parallel: rank {}: a rank without tokens broke the exchange", group.rank()));
  }
  for (auto& [what, p] : pairs) {
    const double diff = (p.first - p.second).abs().max().item<double>();
    if (diff > 1e-10)
      throw std::runtime_error(
          fmt::format("expert parallel: rank {}: the {} differs from one process by {:.3g}", group.rank(), what, diff));
    worst = std::max(worst, diff);
  }
  return worst;
}

ExpertParallel enable_expert_parallel(const std::vector<std::shared_ptr<FeedForward>>& ffns, DataParallel& group) {
  ExpertParallel out;
  std::set<const ExpertBank*> sharded;  // a UniPool pool serves several slots
  for (auto& slot : moe_layers(ffns)) {
    if (!slot->dispatches_whole_experts()) continue;
    if (sharded.insert(slot->experts.get()).second) {
      for (auto& p : slot->experts->parameters()) out.whole += p.numel();
      for (auto& p : shard_bank(*slot->experts, group.rank(), group.world())) out.sharded.push_back(p);
    }
    slot->dispatch_bank = std::make_shared<ExpertParallelBank>(slot->experts, group);
    ++out.layers;
  }
  return out;
}

}  // namespace mf
