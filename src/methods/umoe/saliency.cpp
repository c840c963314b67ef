#include "methods/umoe/saliency.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "analysis/svg_plot.h"
#include "core/init.h"
#include "core/runtime.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "io/weight_source.h"
#include "model/moe_ffn.h"
#include "moe/dispatch.h"

namespace mf {

at::Tensor reap_gates(const at::Tensor& probs_TE, const Assignment& a, bool renormalize) {
  auto g_TE = probs_TE.detach();
  if (renormalize) {
    // each row divided by its selected experts' sum, then clamped (REAP, pruning_metrics.py)
    auto selected_T =
        torch::zeros({g_TE.size(0)}, g_TE.options()).index_add(0, a.token_P, g_TE.index({a.token_P, a.unit_P}));
    g_TE = (g_TE / selected_T.unsqueeze(1)).clamp_min(std::numeric_limits<float>::epsilon());
  }
  return g_TE.index({a.token_P, a.unit_P});
}

SaliencyAccumulator::SaliencyAccumulator(int64_t E)
    : weighted_E(torch::zeros({E}, torch::kDouble)),
      gate_E(torch::zeros({E}, torch::kDouble)),
      count_E(torch::zeros({E}, torch::kLong)) {}

void SaliencyAccumulator::add(const at::Tensor& x_TD, const RouterOutput& routed, UnitBank& experts, bool renormalize) {
  torch::NoGradGuard no_grad;
  const auto& a = routed.assignment;
  const int64_t E = experts.num_units();
  auto g_P = reap_gates(routed.scores_TE, a, renormalize);
  const auto pairs = pair_outputs(x_TD.detach(), a, experts);
  auto norm_P = pairs.out_PD.norm(2, {1}).to(torch::kDouble);  // ||E_e(x)||_2 of the raw expert output
  auto gate_P = g_P.index_select(0, pairs.order_P).to(torch::kDouble);
  const auto unit_P = pairs.unit_P.cpu();
  weighted_E.index_add_(0, unit_P, (gate_P * norm_P).cpu());
  gate_E.index_add_(0, unit_P, gate_P.cpu());
  count_E += at::bincount(unit_P, {}, E);
}

LayerSaliency SaliencyAccumulator::result(int64_t layer) const {
  LayerSaliency s;
  s.layer = layer;
  for (int64_t e = 0; e < count_E.size(0); ++e) {
    const auto n = count_E[e].item<int64_t>();
    s.tokens.push_back(n);
    s.saliency.push_back(n > 0 ? weighted_E[e].item<double>() / static_cast<double>(n) : 0.0);
    s.mean_gate.push_back(n > 0 ? gate_E[e].item<double>() / static_cast<double>(n) : 0.0);
  }
  return s;
}

void check_reap_model(const ModelConfig& c) {
  if (c.ffn != "moe") throw std::invalid_argument("the checkpoint has no MoE layers (model.ffn is not \"moe\")");
  if (c.task != "lm") throw std::invalid_argument("REAP saliency and UMoE take language models (model.task = \"lm\")");
  if (!plan_moe(c).extensions.empty())
    throw std::invalid_argument(
        "REAP saliency and UMoE work on plain routed experts; this model's MoE layers use a method "
        "(UniPool, LatentMoE or UniF-MoE)");
  if (c.moe.router != RouterKind::SoftmaxTopK && c.moe.router != RouterKind::TopP)
    throw std::invalid_argument(fmt::format(
        "REAP saliency takes softmax routers (model.moe.router = softmax_topk or top_p); this model has \"{}\"",
        to_string(c.moe.router)));
}

namespace {

// Runs `forward(b, n)` over the windows in batches while every MoE layer's hook feeds its accumulator.
std::vector<LayerSaliency> accumulate(const std::vector<MoEFeedForward*>& layers, bool renormalize,
                                      const std::function<void()>& run) {
  std::vector<SaliencyAccumulator> acc;
  for (auto* m : layers) {
    acc.emplace_back(m->shape().num_experts);
    m->dispatch_hook = [&acc, m, renormalize, i = acc.size() - 1](const at::Tensor& x, const RouterOutput& r) {
      acc[i].add(x, r, *m->experts, renormalize);
    };
  }
  try {
    run();
  } catch (...) {
    for (auto* m : layers) m->dispatch_hook = nullptr;
    throw;
  }
  std::vector<LayerSaliency> out;
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->dispatch_hook = nullptr;
    out.push_back(acc[i].result(layers[i]->layer));
  }
  return out;
}

}  // namespace

std::vector<LayerSaliency> model_saliency(TransformerLMImpl& model, const at::Tensor& windows_BL, int64_t batch) {
  check_reap_model(model.config());
  std::vector<MoEFeedForward*> layers;
  for (auto& m : moe_layers(model.feed_forwards())) layers.push_back(m.get());
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  auto out = accumulate(layers, model.config().moe.renormalize, [&] {
    for (int64_t b = 0; b < windows_BL.size(0); b += batch)
      model.forward(windows_BL.narrow(0, b, std::min(batch, windows_BL.size(0) - b)));
  });
  model.train(was_training);
  return out;
}

std::vector<LayerSaliency> layerwise_saliency(const std::string& checkpoint, const at::Tensor& windows_BL,
                                              int64_t batch, LayerwisePeak* peak) {
  const auto src = open_weights(checkpoint);  // a checkpoint, or a Hugging Face directory under our names
  const auto& c = src.config.model;
  check_reap_model(c);
  torch::NoGradGuard no_grad;
  const RopeTable rope(c.max_seq_len, c.head_width(), c.rope_theta);
  const MoEPlan plan = plan_moe(c);
  // the residual stream of every window, kept between blocks
  auto h_BLD =
      torch::embedding(src.read({"model.embed_tokens.weight", at::kFloat, {c.vocab_size, c.d_model}}), windows_BL);
  std::vector<LayerSaliency> out;
  int64_t largest = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    DecoderBlock block = [&] {
      const ShapesOnly shapes;  // every tensor is loaded next
      return DecoderBlock(c, l, plan);
    }();
    const std::string prefix = fmt::format("model.layers.{}.", l);
    load_module(*block, src, prefix);
    int64_t bytes = 0;
    for (auto& p : block->parameters()) bytes += static_cast<int64_t>(p.nbytes());
    largest = std::max(largest, bytes);
    block->eval();
    std::vector<MoEFeedForward*> layers;
    if (auto m = std::dynamic_pointer_cast<MoEFeedForward>(block->mlp)) layers.push_back(m.get());
    auto s = accumulate(layers, c.moe.renormalize, [&] {
      AuxLosses aux;
      for (int64_t b = 0; b < h_BLD.size(0); b += batch) {
        const int64_t n = std::min(batch, h_BLD.size(0) - b);
        h_BLD.narrow(0, b, n).copy_(block->forward(h_BLD.narrow(0, b, n), rope, nullptr, aux));
      }
    });
    out.insert(out.end(), s.begin(), s.end());
  }
  if (peak) {
    peak->peak_rss_bytes = peak_rss_bytes();
    peak->model_bytes = src.bytes;
    peak->largest_block_bytes = largest;
  }
  return out;
}

std::vector<int64_t> lowest_saliency(const LayerSaliency& s, double fraction) {
  const auto E = static_cast<int64_t>(s.saliency.size());
  std::vector<int64_t> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s.saliency[a] < s.saliency[b]; });
  order.resize(static_cast<size_t>(std::floor(static_cast<double>(E) * fraction + 1e-9)));
  std::sort(order.begin(), order.end());
  return order;
}

double pair_share(const LayerSaliency& s, const std::vector<int64_t>& experts) {
  const double total = static_cast<double>(std::accumulate(s.tokens.begin(), s.tokens.end(), int64_t{0}));
  double part = 0;
  for (auto e : experts) part += static_cast<double>(s.tokens[e]);
  return total > 0 ? part / total : 0.0;
}

nlohmann::json saliency_json(const std::vector<LayerSaliency>& layers) {
  auto j = nlohmann::json::array();
  for (auto& s : layers) {
    auto experts = nlohmann::json::array();
    for (size_t e = 0; e < s.saliency.size(); ++e)
      experts.push_back(
          {{"expert", e}, {"saliency", s.saliency[e]}, {"tokens", s.tokens[e]}, {"mean_gate", s.mean_gate[e]}});
    j.push_back({{"layer", s.layer}, {"experts", experts}});
  }
  return j;
}

std::vector<LayerSaliency> saliency_from_json(const nlohmann::json& j) {
  std::vector<LayerSaliency> out;
  for (const auto& l : j) {
    LayerSaliency s;
    s.layer = l["layer"].get<int64_t>();
    for (const auto& e : l["experts"]) {
      s.saliency.push_back(e["saliency"].get<double>());
      s.tokens.push_back(e["tokens"].get<int64_t>());
      s.mean_gate.push_back(e["mean_gate"].get<double>());
    }
    out.push_back(s);
  }
  return out;
}

std::string saliency_svg(const std::vector<LayerSaliency>& layers, const std::string& title) {
  std::vector<std::vector<double>> rows;
  HeatmapOptions h;
  for (auto& s : layers) {
    rows.push_back(s.saliency);
    h.row_labels.push_back(fmt::format("layer {}", s.layer));
  }
  h.title = title;
  h.x_label = "expert";
  h.y_label = "MoE layer";
  h.value_label = "REAP saliency S(l, e)";
  return heatmap_svg(rows, h);
}

}  // namespace mf
