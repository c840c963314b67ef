#include "methods/unif/route.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace mf {

double unif_tau(int64_t blocks) {
  const auto B = static_cast<double>(blocks);
  return (B - 1) / (B * B);
}

namespace {

// order[0..n) by value descending, ties in index order (a stable insertion sort: n is B or K)
template <typename scalar_t>
void rank_descending(const scalar_t* value, std::vector<int64_t>& order) {
  for (size_t i = 0; i < order.size(); ++i) {
    const auto v = static_cast<int64_t>(i);
    size_t j = i;
    for (; j > 0 && value[order[j - 1]] < value[v]; --j) order[j] = order[j - 1];
    order[j] = v;
  }
}

// The discrete decisions (no gradient flows through them) of every token: b(x), the shared
// blocks, k(x), the chosen experts, and the pairs unit-major with tokens ascending inside a unit
// (shared (b, t); residual (j, b, t) on the complementary blocks). src_P indexes [alpha_T,
// probs_TQ flattened]: the pair's weight. Two passes over contiguous token ranges, one range per
// thread (a counting sort: ranges' counts per unit give each range its slots), instead of some
// thirty small tensor ops (sorts, cumsum, scatters, nonzeros) that took a tenth of the layer.
struct Decisions {
  at::Tensor b_T, k_T, blocks_T, shared_TG, chosen_TQ, token_P, unit_P, src_P;
};

template <typename scalar_t>
Decisions decide(const at::Tensor& alpha_T, const at::Tensor& probs_TQ, const at::Tensor& priority_TG,
                 const UniFOptions& opt) {
  const int64_t T = probs_TQ.size(0), K = probs_TQ.size(1), B = opt.blocks, U = (K + 1) * B;
  const auto idx = at::TensorOptions().dtype(at::kLong);
  Decisions d;
  d.b_T = at::empty({T}, idx);
  d.k_T = at::empty({T}, idx);
  d.shared_TG = at::zeros({T, B}, at::kBool);
  d.chosen_TQ = at::zeros({T, K}, at::kBool);
  const auto* alpha = alpha_T.data_ptr<scalar_t>();
  const auto* probs = probs_TQ.data_ptr<scalar_t>();
  const scalar_t* priority = opt.prefix_blocks ? nullptr : priority_TG.data_ptr<scalar_t>();
  auto* b_T = d.b_T.data_ptr<int64_t>();
  auto* k_T = d.k_T.data_ptr<int64_t>();
  auto* shared = d.shared_TG.data_ptr<bool>();
  auto* chosen = d.chosen_TQ.data_ptr<bool>();
  const int64_t ranges = T >= 1024 ? std::max(1, at::get_num_threads()) : 1, per = (T + ranges - 1) / ranges;
  std::vector<std::vector<int64_t>> count(ranges, std::vector<int64_t>(U, 0));  // then: each range's next slot
  at::parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> order_G(B), order_Q(K);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = r * per; t < std::min(T, (r + 1) * per); ++t) {
        const scalar_t a = alpha[t];
        // rounding halves up; the clamp only matters where sigmoid saturates to exactly 0 or 1
        const int64_t b = std::clamp<int64_t>(
            static_cast<int64_t>(std::floor(a * static_cast<scalar_t>(B) + scalar_t(0.5))), 1, B - 1);
        // the b blocks of highest priority are shared (ties: the lower block first)
        if (priority)
          rank_descending(priority + t * B, order_G);
        else
          std::iota(order_G.begin(), order_G.end(), 0);
        // the shortest prefix of p (descending, ties: the lower expert first) whose mass reaches 1 - alpha
        const scalar_t* p = probs + t * K;
        rank_descending(p, order_Q);
        int64_t k = 0;
        if (opt.residual_top_k > 0) {
          k = std::min(opt.residual_top_k, K);
        } else {
          double mass = 0;
          const double demand = scalar_t(1) - a;
          while (k < K && mass < demand) mass += p[order_Q[k++]];
        }
        k = std::clamp<int64_t>(k, 1, K);
        b_T[t] = b;
        k_T[t] = k;
        auto& c = count[r];
        for (int64_t i = 0; i < b; ++i) {
          shared[t * B + order_G[i]] = true;
          ++c[order_G[i]];
        }
        for (int64_t i = 0; i < k; ++i) {
          chosen[t * K + order_Q[i]] = true;
          for (int64_t j = b; j < B; ++j) ++c[(order_Q[i] + 1) * B + order_G[j]];
        }
      }
  });
  int64_t P = 0;
  for (int64_t u = 0; u < U; ++u)
    for (auto& c : count) {
      const int64_t n = c[u];
      c[u] = P;  // the range's first slot in unit u
      P += n;
    }
  d.token_P = at::empty({P}, idx);
  d.unit_P = at::empty({P}, idx);
  d.src_P = at::empty({P}, idx);
  auto* token_P = d.token_P.data_ptr<int64_t>();
  auto* unit_P = d.unit_P.data_ptr<int64_t>();
  auto* src_P = d.src_P.data_ptr<int64_t>();
  at::parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> experts(K);
    for (int64_t r = r0; r < r1; ++r) {
      auto& slot = count[r];
      auto put = [&](int64_t u, int64_t t, int64_t src) {
        const int64_t i = slot[u]++;
        token_P[i] = t;
        unit_P[i] = u;
        src_P[i] = src;
      };
      for (int64_t t = r * per; t < std::min(T, (r + 1) * per); ++t) {
        int64_t k = 0;
        for (int64_t q = 0; q < K; ++q)
          if (chosen[t * K + q]) experts[k++] = q;
        for (int64_t j = 0; j < B; ++j) {
          if (shared[t * B + j]) {
            put(j, t, t);
            continue;
          }
          for (int64_t i = 0; i < k; ++i) put((experts[i] + 1) * B + j, t, T + t * K + experts[i]);
        }
      }
    }
  });
  d.blocks_T = d.b_T + d.k_T * (B - d.b_T);
  return d;
}

}  // namespace

UniFRouting unif_route(const at::Tensor& logits_TJ, const at::Tensor& priority_TG, const UniFOptions& opt) {
  const int64_t T = logits_TJ.size(0), K = logits_TJ.size(1) - 1, B = opt.blocks;
  const double tau = unif_tau(B);
  UniFRouting r;
  r.alpha_T = opt.fixed_alpha > 0 ? at::full({T}, opt.fixed_alpha, logits_TJ.options())
                                  : tau + (1 - 2 * tau) * at::sigmoid(logits_TJ.select(1, 0));
  r.probs_TQ = at::softmax(logits_TJ.narrow(1, 1, K), 1);
  // the decisions are made on the host (a device's logits are copied there once)
  auto host = [](const at::Tensor& t) { return t.detach().to(at::kCPU).contiguous(); };
  const auto priority = opt.prefix_blocks ? at::Tensor() : host(priority_TG.to(logits_TJ.scalar_type()));
  Decisions d;
  AT_DISPATCH_FLOATING_TYPES(logits_TJ.scalar_type(), "unif_route",
                             [&] { d = decide<scalar_t>(host(r.alpha_T), host(r.probs_TQ), priority, opt); });
  const auto device = logits_TJ.device();
  r.b_T = d.b_T.to(device);
  r.k_T = d.k_T.to(device);
  r.blocks_T = d.blocks_T.to(device);
  r.shared_TG = d.shared_TG.to(device);
  r.chosen_TQ = d.chosen_TQ.to(device);
  auto& a = r.assignment;
  a.token_P = d.token_P.to(device);
  a.unit_P = d.unit_P.to(device);
  a.weight_P = at::cat({r.alpha_T, r.probs_TQ.reshape({-1})}).index_select(0, d.src_P.to(device));
  a.sorted_by_unit = true;
  a.num_tokens = T;
  a.num_units = (K + 1) * B;
  r.weight_TJ = at::cat({r.alpha_T.unsqueeze(1), r.probs_TQ * r.chosen_TQ.to(r.probs_TQ.dtype())}, 1);
  return r;
}

at::Tensor unif_diversity_loss(const at::Tensor& weight_JD) {
  auto gram_JJ = at::matmul(weight_JD, weight_JD.t());
  // the clamp keeps the gradient finite (zero) at an exactly orthonormal W
  return (gram_JJ - at::eye(weight_JD.size(0), weight_JD.options())).pow(2).sum().clamp_min(1e-30).sqrt();
}

}  // namespace mf
