#include "moe/routers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/linear.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "core/init.h"
#include "core/tiles_linear.h"
#include "core/util.h"
#include "moe/select_rows.h"
#include "moe/softmax_top_k.h"

namespace mf {

at::Tensor switch_aux_loss(const at::Tensor& probs_TE, const at::Tensor& unit_P, int64_t E, double alpha) {
  const double pairs = static_cast<double>(std::max<int64_t>(1, unit_P.numel()));
  auto f_E = at::bincount(unit_P, {}, E).to(probs_TE.dtype()) / pairs;
  auto P_E = probs_TE.mean(0);
  return alpha * static_cast<double>(E) * (f_E * P_E).sum();
}

at::Tensor sequence_aux_loss(const at::Tensor& scores_TE, const at::Tensor& token_P, const at::Tensor& unit_P,
                             int64_t seq_len, int64_t top_k, double alpha) {
  const int64_t T = scores_TE.size(0), E = scores_TE.size(1);
  TORCH_CHECK(seq_len > 0 && T % seq_len == 0, "sequence-wise aux loss: ", T, " tokens are not whole sequences of ",
              seq_len);
  const int64_t B = T / seq_len;
  auto pair_BE = torch::div(token_P, seq_len, "trunc") * E + unit_P;
  auto counts_BE = torch::zeros({B * E}, scores_TE.options())
                       .index_add(0, pair_BE, torch::ones({unit_P.numel()}, scores_TE.options()));
  auto f_BE = counts_BE.view({B, E}) * (static_cast<double>(E) / static_cast<double>(top_k * seq_len));
  auto P_BE = scores_TE.view({B, seq_len, E}).mean(1);
  return alpha * (f_BE * P_BE).sum(1).mean();
}

at::Tensor router_z_loss(const at::Tensor& logits_TE, double beta) { return lse_z_loss(logits_TE.logsumexp(-1), beta); }

at::Tensor lse_z_loss(const at::Tensor& lse_T, double beta) { return beta * lse_T.pow(2).mean(); }

at::Tensor top_p_counts(const at::Tensor& probs_TE, double threshold) {
  auto sorted_TE = std::get<0>(probs_TE.sort(-1, /*descending=*/true));
  auto before_TE = sorted_TE.cumsum(-1) - sorted_TE;  // mass strictly ahead of each entry
  return (before_TE < threshold).sum(-1);             // >= 1: the first entry is always taken
}

double norm_router_constant(int64_t M, int64_t k, int64_t samples) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(M, k, samples);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  SplitMix64 rng(42);
  std::vector<double> x(static_cast<size_t>(M));
  double sum = 0;
  int64_t used = 0;
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t i = 0; i < M; i += 2) {  // Box-Muller, two normals per pair of uniforms
      const double u1 = 1.0 - rng.uniform();
      const double u2 = rng.uniform();
      const double r = std::sqrt(-2.0 * std::log(u1));
      x[i] = r * std::cos(2 * M_PI * u2);
      if (i + 1 < M) x[i + 1] = r * std::sin(2 * M_PI * u2);
    }
    double norm = 0;
    for (double v : x) norm += v * v;
    norm = std::sqrt(norm);
    std::partial_sort(x.begin(), x.begin() + k, x.end(), std::greater<>());
    double top = 0;
    for (int64_t i = 0; i < k; ++i) top += x[i] > 0 ? (x[i] / norm) * (x[i] / norm) : 0;
    if (top <= 0) continue;  // all entries negative: 1/0 in the reference code
    sum += 1.0 / std::sqrt(top);
    ++used;
  }
  return cache[key] = used ? sum / static_cast<double>(used) : 1.0;
}

at::Tensor norm_router_scores(const at::Tensor& logits_TE, const at::Tensor& sigma, double c, double eps) {
  auto norm_T1 = logits_TE.norm(2, -1, /*keepdim=*/true) + eps;
  return (logits_TE / norm_T1).relu() * (sigma.to(logits_TE.dtype()) * c);
}

RouterImpl::RouterImpl(int64_t d_model, RouterOptions opt) : opt_(std::move(opt)) {
  TORCH_CHECK(opt_.num_experts >= 1 && opt_.top_k >= 1 && opt_.top_k <= opt_.num_experts,
              "router: need 1 <= top_k <= num_experts");
  weight = register_parameter("weight", init_normal({opt_.num_experts, d_model}, 0.02));
  selection_bias = register_buffer("selection_bias", torch::zeros({opt_.num_experts}));
  if (opt_.kind == RouterKind::NormTopK) {
    norm_scale = register_parameter("norm_scale", torch::ones({1}));
    norm_constant = norm_router_constant(opt_.num_experts, opt_.top_k);
  }
  if (opt_.gate_scale > 0) gate_scale = register_parameter("gate_scale", torch::full({1}, opt_.gate_scale));
}

static bool is_top_k(RouterKind k) {
  return k == RouterKind::SoftmaxTopK || k == RouterKind::SigmoidTopK || k == RouterKind::NormTopK;
}

at::Tensor RouterImpl::logits(const at::Tensor& x_TD) const {
  const auto dtype = x_TD.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // router math in fp32
  return tiles_linear(x_TD.to(dtype).contiguous(), weight.to(dtype));
}

RouterImpl::Scores RouterImpl::score(const at::Tensor& x_TD) const {
  Scores s;
  s.logits_TE = logits(x_TD);
  s.probs_TE = s.logits_TE.softmax(-1);
  switch (opt_.kind) {
    case RouterKind::SigmoidTopK: s.select_TE = s.logits_TE.sigmoid(); break;
    case RouterKind::NormTopK:
      s.select_TE = norm_router_scores(s.logits_TE, norm_scale, norm_constant, opt_.norm_eps);
      break;
    default: s.select_TE = s.probs_TE;
  }
  return s;
}

RouterImpl::Selection RouterImpl::select(const Scores& s) {
  const int64_t T = s.logits_TE.size(0), E = opt_.num_experts, K = opt_.top_k;
  const auto index_opts = s.logits_TE.options().dtype(at::kLong);
  Selection sel;
  auto rows_T = torch::arange(T, index_opts);
  if (is_top_k(opt_.kind)) {
    auto key_TE = s.select_TE.detach();
    if (opt_.bias_update > 0) key_TE = key_TE + selection_bias.to(key_TE.dtype());
    return top_k_pairs(top_k_index(key_TE, K));
  } else if (opt_.kind == RouterKind::TopP) {
    auto [sorted_TE, order_TE] = s.probs_TE.sort(-1, /*descending=*/true);
    auto counts_T = top_p_counts(s.probs_TE.detach(), opt_.top_p);
    sel.keep_TE = torch::arange(E, index_opts).unsqueeze(0) < counts_T.unsqueeze(1);
    auto pos_P2 = sel.keep_TE.nonzero();  // (token, rank), token-major
    sel.token_P = pos_P2.select(1, 0);
    sel.rank_P = pos_P2.select(1, 1);
    sel.unit_P = order_TE.index({sel.token_P, sel.rank_P});
    sel.sorted_TE = sorted_TE;
  } else if (opt_.kind == RouterKind::Balanced) {  // benchmarks
    sel.token_P = rows_T.repeat_interleave(K);
    sel.unit_P = torch::arange(T * K, index_opts) % E;
  } else {  // uniform_random (probes): K distinct units per token
    auto gen = at::make_generator<at::CPUGeneratorImpl>(opt_.seed + static_cast<uint64_t>(calls_++));
    auto noise_TE = torch::rand({T, E}, gen, torch::TensorOptions().dtype(torch::kFloat));
    sel.token_P = rows_T.repeat_interleave(K);
    sel.unit_P = std::get<1>(noise_TE.topk(K, -1)).reshape({-1}).to(s.logits_TE.device());
  }
  return sel;
}

RouterImpl::Selection RouterImpl::top_k_pairs(const at::Tensor& index_TK) const {
  Selection sel;
  sel.index_TK = index_TK;
  sel.token_P = torch::arange(index_TK.size(0), index_TK.options()).repeat_interleave(index_TK.size(1));
  sel.unit_P = index_TK.reshape({-1});
  return sel;
}

at::Tensor RouterImpl::weight_pairs(const Scores& s, const Selection& sel) const {
  if (is_top_k(opt_.kind)) {
    auto w_TK = s.select_TE.gather(1, sel.index_TK);
    if (opt_.renormalize) {
      auto sum_T1 = w_TK.sum(-1, true);
      // NormRouter weights may all be 0 (no positive logit): keep them 0 rather than 0/0
      w_TK = w_TK / (opt_.kind == RouterKind::NormTopK ? sum_T1.clamp_min(1e-30) : sum_T1);
    }
    return w_TK.reshape({-1});
  }
  if (opt_.kind == RouterKind::TopP) {
    auto w_P = sel.sorted_TE.index({sel.token_P, sel.rank_P});
    if (!opt_.renormalize) return w_P;
    auto kept_T = (sel.sorted_TE * sel.keep_TE.to(sel.sorted_TE.dtype())).sum(-1);
    return w_P / kept_T.index_select(0, sel.token_P);
  }
  return torch::full({sel.unit_P.numel()}, 1.0 / static_cast<double>(opt_.top_k), s.logits_TE.options());
}

RouterOutput RouterImpl::forward(const at::Tensor& x_TD) {
  Scores s;
  Selection sel;
  at::Tensor weight_P, lse_T;
  if (opt_.kind == RouterKind::SoftmaxTopK && x_TD.is_cpu() && x_TD.dim() == 2) {  // logits: float32 or float64
    s.logits_TE = logits(x_TD);  // softmax, top-k, weights and logsumexp in one pass (moe/softmax_top_k)
    auto f =
        softmax_top_k(s.logits_TE, opt_.top_k, opt_.renormalize, opt_.bias_update > 0 ? selection_bias : at::Tensor());
    s.probs_TE = s.select_TE = f.probs_TE;
    sel = top_k_pairs(f.index_TK);
    weight_P = f.weight_TK.reshape({-1});
    lse_T = f.lse_T;
  } else {
    s = score(x_TD);
    sel = select(s);
    weight_P = weight_pairs(s, sel);
  }
  RouterOutput out;
  auto& a = out.assignment;
  a.num_tokens = x_TD.size(0);
  a.num_units = opt_.num_experts;
  a.token_P = sel.token_P;
  a.unit_P = sel.unit_P;
  a.weight_P = weight_P;
  if (gate_scale.defined()) a.weight_P = a.weight_P * gate_scale.to(a.weight_P.dtype());
  // balance losses act on the softmax probabilities, or on NormRouter's scores
  out.scores_TE = opt_.kind == RouterKind::NormTopK ? s.select_TE : s.probs_TE;
  if (opt_.aux_loss_coef > 0)
    out.losses.emplace_back("aux", switch_aux_loss(out.scores_TE, a.unit_P, opt_.num_experts, opt_.aux_loss_coef));
  if (opt_.z_loss_coef > 0)
    out.losses.emplace_back(
        "z", lse_T.defined() ? lse_z_loss(lse_T, opt_.z_loss_coef) : router_z_loss(s.logits_TE, opt_.z_loss_coef));
  if (opt_.seq_aux_loss_coef > 0 && seq_len_ > 0) {
    const bool normalise = opt_.kind == RouterKind::SigmoidTopK || opt_.kind == RouterKind::NormTopK;
    auto seq_scores_TE = normalise ? s.select_TE / s.select_TE.sum(-1, true).clamp_min(1e-30) : s.probs_TE;
    out.losses.emplace_back(
        "seq_aux", sequence_aux_loss(seq_scores_TE, a.token_P, a.unit_P, seq_len_, opt_.top_k, opt_.seq_aux_loss_coef));
  }
  return out;
}

void RouterImpl::update_selection_bias(const at::Tensor& load_E) {
  if (opt_.bias_update <= 0 || !load_E.defined()) return;
  torch::NoGradGuard g;
  auto load = load_E.to(at::kDouble);
  auto step_E = (load.mean() - load).sign() * opt_.bias_update;
  selection_bias.add_(step_E.to(selection_bias.scalar_type()));
}

}  // namespace mf
