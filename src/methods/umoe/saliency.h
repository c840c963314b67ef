// REAP expert saliency (../shared/specs/umoe.md, step 1): for expert e of MoE layer l,
//   S(l, e) = mean over the calibration tokens x routed to e of g_e(x) * ||E_e(x)||_2
// with g the softmax over all E router logits (float32, float64 in tests), divided by the sum
// over the token's selected experts when the router renormalises and clamped at float32
// epsilon, as REAP's reference code does. "Routed to e" is the model's own selection (an
// aux-free selection bias included). Experts never selected keep S = 0.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/config.h"
#include "model/transformer.h"
#include "moe/banks.h"
#include "moe/routing.h"

namespace mf {

struct LayerSaliency {
  int64_t layer = 0;
  std::vector<double> saliency;   // S(l, e)
  std::vector<int64_t> tokens;    // calibration tokens routed to e
  std::vector<double> mean_gate;  // mean of g over those tokens
};

// g of every routed pair [P]: probs_TE is the softmax over all experts.
at::Tensor reap_gates(const at::Tensor& probs_TE, const Assignment& a, bool renormalize);

// One layer's running sums (float64). Adding batches and dividing at the end equals REAP's
// count-weighted running mean of batch means.
class SaliencyAccumulator {
 public:
  explicit SaliencyAccumulator(int64_t num_experts);
  // x_TD: what the experts see; routed: the router's output on it; experts: the layer's bank.
  void add(const at::Tensor& x_TD, const RouterOutput& routed, UnitBank& experts, bool renormalize);
  LayerSaliency result(int64_t layer) const;

 private:
  at::Tensor weighted_E, gate_E, count_E;
};

// Throws when the model's MoE layers are not plain routed experts with a softmax router
// (a method's layers, NormRouter, sigmoid or random routers): REAP is defined for those only.
void check_reap_model(const ModelConfig& c);

// Every MoE layer of a loaded LM over the calibration windows [B, L] (batches of `batch`).
std::vector<LayerSaliency> model_saliency(TransformerLMImpl& model, const at::Tensor& windows_BL, int64_t batch);

// The same, one decoder block at a time: only the embedding and one block's tensors are read
// from `checkpoint`'s model.safetensors at any moment; the hidden states of the windows are kept.
struct LayerwisePeak {
  int64_t peak_rss_bytes = 0;  // of this process (VmHWM) after the pass
  int64_t model_bytes = 0;     // model.safetensors on disk
  int64_t largest_block_bytes = 0;
};
std::vector<LayerSaliency> layerwise_saliency(const std::string& checkpoint, const at::Tensor& windows_BL,
                                              int64_t batch, LayerwisePeak* peak = nullptr);

// The experts REAP would prune: the `fraction` lowest saliencies, ties going to the lower
// index (count floor(E * fraction)); sorted ascending by index.
std::vector<int64_t> lowest_saliency(const LayerSaliency& s, double fraction);
// Share of the layer's routed pairs that went to `experts`.
double pair_share(const LayerSaliency& s, const std::vector<int64_t>& experts);

nlohmann::json saliency_json(const std::vector<LayerSaliency>& layers);
std::vector<LayerSaliency> saliency_from_json(const nlohmann::json& j);  // saliency_json's inverse
std::string saliency_svg(const std::vector<LayerSaliency>& layers, const std::string& title);

}  // namespace mf
