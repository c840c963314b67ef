// IntBMoE (arXiv 2609.21346, ../shared/specs/intbmoe.md) as an FFN-slot kind (model.ffn =
// "intb"): K blocks, each composed from the whole pool of E expert bases by a hypernetwork over
// a learned codebook, routed top-k per token through the engine's dispatcher.
//
// Shape letters (src/core/shapes.h): the spec's K blocks are E here (what the router chooses
// among, as in the engine), its E bases A; C codebook width, R hypernetwork width, O / I the
// output / input width of one internal layer. Formulas in comments keep the spec's letters.
#pragma once
#include <torch/nn/modules/normalization.h>

#include <nlohmann/json.hpp>

#include <optional>

#include "core/config.h"
#include "io/safetensors.h"
#include "model/layers.h"
#include "model/moe_ffn.h"
#include "moe/banks.h"
#include "moe/routing.h"

namespace mf {

// [model.moe.intb]; K = model.moe.num_experts, k = model.moe.top_k, the internal width
// d_1 .. d_{L-1} = model.moe.expert_hidden, the blocks = model.moe.layers.
struct IntBConfig : MethodSectionOf<IntBConfig> {
  int64_t basis = 16;           // E expert bases per internal layer
  int64_t internal_layers = 2;  // L
  int64_t codebook_dim = 32;    // C
  int64_t hyper_hidden = 16;    // H
  int64_t router_hidden = 64;   // R
  double lambda0 = 1.0;         // DPRG lambda at init
  int64_t shared_hidden = 0;    // width of the always-on shared SwiGLU expert (0 = model.moe.expert_hidden)
  // ablations
  bool shared_expert = true;
  bool gate_path = true;
  bool filter = true;
  bool learn_lambda = true;             // false: lambda stays lambda0
  std::string coefficients = "linear";  // linear (divided by sqrt(E)) | softmax over the bases
  bool baked = false;  // the K blocks stored composed (a serving export): no codebook, hypernetwork or pools
};

struct IntBOptions {
  int64_t blocks = 8, basis = 16, top_k = 2, internal_layers = 2, hidden = 0;
  int64_t codebook_dim = 32, hyper_hidden = 16, router_hidden = 64, shared_hidden = 0;  // 0 = no shared expert
  double lambda0 = 1.0;
  bool gate_path = true, filter = true, learn_lambda = true, softmax_coefficients = false, baked = false;
  int64_t removed_basis = -1;  // expert-removal probe: basis e left out of every composition (1/sqrt(E-1))
};
IntBOptions intb_options(const ModelConfig& c);

// The K blocks of one step, composed from the pools: per internal layer l the value and gate
// weights [K, O, I] and biases [K, O]; and the codebook's share of the filter pre-activation.
struct ComposedBlocks {
  std::vector<at::Tensor> value_EOI, value_EO, gate_EOI, gate_EO;
  at::Tensor filter_ED;                      // W_f^c c_b + b_f
  at::Tensor alpha_value_EA, alpha_gate_EA;  // recipes, before the 1/sqrt(E) scale
};

class IntBFeedForward;

// The composed blocks as the dispatcher's units: filter + DPRG (+ LayerNorm between internal
// layers) per block. The filter's x part W_f^x x is computed once per token (per_token).
class IntBBank : public UnitBank {
 public:
  IntBBank(IntBFeedForward& slot, const ComposedBlocks& blocks) : slot_(slot), blocks_(blocks) {}
  int64_t num_units() const override;
  at::Tensor per_token(const at::Tensor& x_TD) override;
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) override;
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E, const at::Tensor& side_PD) override;
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override;

 private:
  at::Tensor block(int64_t b, const at::Tensor& rows, const at::Tensor& filter_x);
  IntBFeedForward& slot_;
  const ComposedBlocks& blocks_;
};

class IntBFeedForward : public FeedForward, public DeclaresParamRoles, public ReportsRouting {
 public:
  IntBFeedForward(int64_t d_model, IntBOptions opt, int64_t layer = -1);
  RoutingStats last_stats() const override;  // block load of the last forward pass
  int64_t routing_layer() const override { return layer_; }
  int64_t routed_units() const override { return opt_.blocks; }
  torch::Tensor forward(const torch::Tensor& x, AuxLosses& aux) override;
  ParamRoleList param_roles() const override;
  void train(bool on = true) override;  // a mode change drops the inference cache

  // Composes all K blocks from the current weights (once per training forward).
  ComposedBlocks compose() const;
  // Inference: compose once, reuse until the mode changes or clear_cache().
  const ComposedBlocks& cached_blocks();
  void clear_cache() { cache_.reset(); }
  bool cached() const { return cache_.has_value(); }
  RouterOutput route(const at::Tensor& x_TD) const;  // top-k of the router MLP, softmax over all K
  const IntBOptions& options() const { return opt_; }
  void set_removed_basis(int64_t e);     // the removal probe (-1 = none); drops the cache
  int64_t layer_width(int64_t l) const;  // d_l: d_0 = d_L = D, else the internal width
  // The tensors of this slot as a baked slot (model.moe.intb.baked) has them: the K blocks
  // composed now in place of codebook, hypernetwork and pools; local names.
  NamedTensors baked_tensors() const;

  at::Tensor codebook_EC;
  torch::nn::Linear hyper{nullptr}, value_head{nullptr}, gate_head{nullptr};
  torch::nn::LayerNorm hyper_norm{nullptr};
  std::vector<at::Tensor> basis_AOI, basis_AO;  // per internal layer: "basis{l}.weight", "basis{l}.bias"
  torch::nn::Linear router_in{nullptr}, router_out{nullptr};
  torch::nn::Linear filter{nullptr};              // W_f [D, D + C]: x part = first D columns
  std::vector<RMSNorm> gate_norms;                // per internal layer (eps 1e-8)
  std::vector<torch::nn::LayerNorm> layer_norms;  // between internal layers
  at::Tensor lambda;                              // [1]
  std::shared_ptr<ExpertBank> shared_expert;      // SwiGLU, no biases

 private:
  friend class IntBBank;
  IntBOptions opt_;
  int64_t d_model_;
  std::optional<ComposedBlocks> cache_;
  ComposedBlocks baked_;  // baked slots: the stored blocks (parameters)
  int64_t layer_;
  RoutingTally last_;
};

// What one IntBMoE slot costs (../shared/specs/intbmoe.md, "Cost"); FLOPs count 2 per
// multiply-add, elementwise work left out.
struct IntBCost {
  int64_t parameters = 0;               // stored; all of them shape every token (full participation)
  int64_t executed_parameters = 0;      // multiplied per token with the cache: router, filter x part, k blocks, shared
  int64_t materialized_parameters = 0;  // the K composed blocks (and the codebook's filter part) the cache holds
  int64_t flops_cached = 0;             // per token, with the cache
  int64_t flops_compose = 0;            // composing all K blocks once (every forward without the cache)
};
IntBCost intb_cost(const IntBFeedForward& m);
nlohmann::json intb_accounting(const std::vector<std::shared_ptr<FeedForward>>& ffns, int64_t tokens_per_forward);

// Writes `checkpoint` with every IntBMoE slot baked (model.moe.intb.baked = true): the K blocks
// composed once, codebook, hypernetworks and pools dropped; serving computes what the
// cached slot computes, bit for bit.
struct BakeReport {
  int64_t slots = 0, parameters_before = 0, parameters_after = 0;
};
BakeReport bake_intb(const std::string& checkpoint, const std::string& out);

// Registers model.ffn = "intb", the [model.moe.intb] keys and their validation.
void register_intb();

}  // namespace mf
