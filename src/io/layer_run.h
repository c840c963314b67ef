// One configured FFN slot (dense, MoE, UniPool, LatentMoE, UniF-MoE, IntBMoE) run alone on
// given tensors: `moeforge layer run`. The slot is built inside its whole model, so pieces it
// shares with other blocks (a UniPool pool) exist; its tensors are named as in a checkpoint
// with "model.layers.<N>.mlp." (or "layers.<N>.mlp." for a ViT) removed, a shared pool as
// "experts.*".
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "io/safetensors.h"
#include "model/layers.h"

namespace mf {

struct LayerSlot {
  std::shared_ptr<torch::nn::Module> model;  // owns the slot and anything it shares
  std::shared_ptr<FeedForward> slot;
  NamedTensors tensors;  // the slot's parameters and buffers, by local name
};

// Block `layer` of the config's model, initialised by role from train.seed, in `dtype`.
LayerSlot build_layer_slot(const Config& cfg, int64_t layer, at::ScalarType dtype = at::kFloat);

// Copies `weights` into the slot; a missing, extra or wrongly shaped tensor is a FormatError naming it.
void load_layer_weights(LayerSlot& s, const SafetensorsData& weights, const std::string& source);

// y for x [..., D] (tensor "y"); with dy, also "dx" and "grad.<name>" of every parameter. x is
// converted to the slot's dtype (build it in float64 to test against an oracle).
NamedTensors run_layer(LayerSlot& s, const at::Tensor& x, const at::Tensor& dy = {});

// An example input for the config's model: "x" and "dy" [1, 8, d], normal(0, 1) from train.seed.
NamedTensors example_layer_input(const Config& cfg);

// Tensor `name` of the safetensors file at `path`; a FormatError naming both when it is absent.
at::Tensor tensor_from(const std::string& path, const std::string& name);

}  // namespace mf
