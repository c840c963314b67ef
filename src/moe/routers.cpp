#include "moe/routers.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/linear.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "core/util.h"

namespace mf {

int64_t RoutingStats::dead_units() const {
  return std::count(load.begin(), load.end(), int64_t{0});
}

double RoutingStats::max_over_mean() const {
  if (load.empty()) return 0;
  double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  return mean > 0 ? static_cast<double>(*std::max_element(load.begin(), load.end())) / mean : 0;
}

double RoutingStats::cv() const {
  if (load.empty()) return 0;
  double n = static_cast<double>(load.size()), mean = std::accumulate(load.begin(), load.end(), 0.0) / n, var = 0;
  for (auto l : load) var += (l - mean) * (l - mean) / n;
  return mean > 0 ? std::sqrt(var) / mean : 0;
}

RoutingStats routing_stats(const RouterOutput& out) {
  RoutingStats s;
  const auto& a = out.assignment;
  auto load = at::bincount(a.unit, {}, a.num_units);
  s.load.assign(load.data_ptr<int64_t>(), load.data_ptr<int64_t>() + a.num_units);
  if (out.probs.defined() && a.num_tokens > 0) {
    auto p = out.probs.to(at::kDouble);
    p = p / p.sum(-1, true).clamp_min(1e-30);  // NormRouter scores are not a distribution
    s.entropy = (-(p * p.clamp_min(1e-30).log()).sum(-1)).mean().item<double>();
  }
  s.mean_units_per_token = a.num_tokens ? static_cast<double>(a.unit.numel()) / static_cast<double>(a.num_tokens) : 0;
  for (auto& [name, v] : out.losses) s.losses.emplace_back(name, v.item<double>());
  return s;
}

at::Tensor switch_aux_loss(const at::Tensor& probs, const at::Tensor& unit, int64_t E, double alpha) {
  auto f = at::bincount(unit, {}, E).to(probs.dtype()) / static_cast<double>(std::max<int64_t>(1, unit.numel()));
  auto P = probs.mean(0);
  return alpha * static_cast<double>(E) * (f * P).sum();
}

at::Tensor sequence_aux_loss(const at::Tensor& probs, const at::Tensor& token, const at::Tensor& unit,
                             int64_t seq_len, int64_t top_k, double alpha) {
  const int64_t T = probs.size(0), E = probs.size(1), S = T / seq_len;
  TORCH_CHECK(seq_len > 0 && T % seq_len == 0, "sequence-wise aux loss: ", T, " tokens are not whole sequences of ", seq_len);
  auto counts = torch::zeros({S * E}, probs.options()).index_add(0, torch::div(token, seq_len, "trunc") * E + unit,
                                                               torch::ones({unit.numel()}, probs.options()));
  auto f = counts.view({S, E}) * (static_cast<double>(E) / static_cast<double>(top_k * seq_len));
  auto P = probs.view({S, seq_len, E}).mean(1);
  return alpha * (f * P).sum(1).mean();
}

at::Tensor router_z_loss(const at::Tensor& logits, double beta) {
  return beta * logits.logsumexp(-1).pow(2).mean();
}

at::Tensor top_p_counts(const at::Tensor& probs, double threshold) {
  auto sorted = std::get<0>(probs.sort(-1, /*descending=*/true));
  auto before = sorted.cumsum(-1) - sorted;  // mass strictly ahead of each entry
  return (before < threshold).sum(-1);       // >= 1: the first entry is always taken
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
      const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform(), r = std::sqrt(-2.0 * std::log(u1));
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
    sum += 1.0 / std::sqrt(top), ++used;
  }
  return cache[key] = used ? sum / static_cast<double>(used) : 1.0;
}

RouterImpl::RouterImpl(int64_t d_model, RouterOptions opt) : opt_(std::move(opt)) {
  TORCH_CHECK(opt_.num_experts >= 1 && opt_.top_k >= 1 && opt_.top_k <= opt_.num_experts,
              "router: need 1 <= top_k <= num_experts");
  weight = register_parameter("weight", torch::randn({opt_.num_experts, d_model}) * 0.02);
  selection_bias = register_buffer("selection_bias", torch::zeros({opt_.num_experts}));
  if (opt_.kind == "norm_topk") {
    norm_scale = register_parameter("norm_scale", torch::ones({1}));
    norm_constant = norm_router_constant(opt_.num_experts, opt_.top_k);
  }
}

// NormRouter: s = sigma * c * ReLU(z / (||z||_2 + eps)); the norm runs over all E logits
// before the ReLU, so negative logits shrink the positive scores.
static at::Tensor norm_router_scores(const at::Tensor& logits, const at::Tensor& sigma, double c, double eps) {
  auto norm = logits.norm(2, -1, /*keepdim=*/true) + eps;
  return (logits / norm).relu() * (sigma.to(logits.dtype()) * c);
}

RouterOutput RouterImpl::forward(const at::Tensor& x) {
  const auto dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;  // router math in fp32
  const int64_t T = x.size(0), E = opt_.num_experts, k = opt_.top_k;
  auto logits = torch::nn::functional::linear(x.to(dtype), weight.to(dtype));  // [T, E]
  auto probs = logits.softmax(-1);
  RouterOutput out;
  auto& a = out.assignment;
  a.num_tokens = T, a.num_units = E;
  auto rows = torch::arange(T, torch::kLong);
  const auto& kind = opt_.kind;
  if (kind == "norm_topk") out.scores = norm_router_scores(logits, norm_scale, norm_constant, opt_.norm_eps);
  if (kind == "softmax_topk" || kind == "sigmoid_topk" || kind == "norm_topk") {
    auto scores = kind == "sigmoid_topk" ? logits.sigmoid() : kind == "norm_topk" ? out.scores : probs;
    auto select = opt_.bias_update > 0 ? scores.detach() + selection_bias.to(dtype) : scores.detach();
    auto idx = std::get<1>(select.topk(k, -1, /*largest=*/true, /*sorted=*/true));  // [T, k]
    auto w = scores.gather(1, idx);
    // NormRouter weights may all be 0 (no positive logit): keep them 0 rather than 0/0
    if (opt_.renormalize) w = kind == "norm_topk" ? w / w.sum(-1, true).clamp_min(1e-30) : w / w.sum(-1, true);
    a.token = rows.repeat_interleave(k), a.unit = idx.reshape({-1}), a.weight = w.reshape({-1});
  } else if (kind == "top_p") {
    auto sorted = probs.sort(-1, /*descending=*/true);
    auto vals = std::get<0>(sorted), idx = std::get<1>(sorted);
    auto keep = torch::arange(E, torch::kLong).unsqueeze(0) < top_p_counts(probs.detach(), opt_.top_p).unsqueeze(1);
    auto pos = keep.nonzero();  // [N, 2] (token, rank), token-major
    auto t = pos.select(1, 0), r = pos.select(1, 1);
    auto w = vals.index({t, r});
    if (opt_.renormalize) w = w / (vals * keep.to(dtype)).sum(-1).index_select(0, t);
    a.token = t, a.unit = idx.index({t, r}), a.weight = w;
  } else if (kind == "uniform_random" || kind == "balanced") {  // probes and benchmarks
    at::Tensor idx;
    if (kind == "balanced") {
      idx = (torch::arange(T * k, torch::kLong) % E).view({T, k});
    } else {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(opt_.seed + static_cast<uint64_t>(calls_++));
      idx = std::get<1>(torch::rand({T, E}, gen, torch::TensorOptions().dtype(torch::kFloat)).topk(k, -1));
    }
    a.token = rows.repeat_interleave(k), a.unit = idx.reshape({-1});
    a.weight = torch::full({T * k}, 1.0 / static_cast<double>(k), torch::TensorOptions().dtype(dtype));
  } else {
    TORCH_CHECK(false, "unknown router kind '", kind, "'");
  }
  if (!out.scores.defined()) out.scores = probs;
  if (opt_.aux_loss_coef > 0) out.losses.emplace_back("aux", switch_aux_loss(out.scores, a.unit, E, opt_.aux_loss_coef));
  if (opt_.z_loss_coef > 0) out.losses.emplace_back("z", router_z_loss(logits, opt_.z_loss_coef));
  if (opt_.seq_aux_loss_coef > 0 && opt_.seq_len > 0)
    out.losses.emplace_back("seq_aux", sequence_aux_loss(probs, a.token, a.unit, opt_.seq_len, k, opt_.seq_aux_loss_coef));
  out.probs = out.scores.detach();
  return out;
}

void RouterImpl::update_selection_bias(const std::vector<int64_t>& load) {
  if (opt_.bias_update <= 0 || load.empty()) return;
  torch::NoGradGuard g;
  double mean = std::accumulate(load.begin(), load.end(), 0.0) / static_cast<double>(load.size());
  auto* b = selection_bias.data_ptr<float>();
  for (size_t i = 0; i < load.size(); ++i) {
    double d = mean - static_cast<double>(load[i]);
    b[i] += static_cast<float>(opt_.bias_update * ((d > 0) - (d < 0)));
  }
}

}  // namespace mf
