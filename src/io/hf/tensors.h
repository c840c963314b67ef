// Our tensor names <-> Hugging Face tensor names. Attention, norms, embedding, head and dense
// FFNs keep their names; a MoE block's stacked expert bank [E, 2F, D] / [E, D, F] is the
// per-expert gate/up/down matrices, its router and shared expert are renamed per architecture.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <string>

#include "io/hf/arch.h"
#include "io/safetensors.h"

namespace mf::hf {

using ReadHf = std::function<at::Tensor(const std::string& hf_name)>;  // float32, FormatError if missing

// Our tensor `name` of shape `shape`, built from the HF tensors `read` returns; records every HF
// name it read in `used`. FormatError names the tensor when shapes disagree.
at::Tensor import_tensor(const Arch& a, const std::string& name, at::IntArrayRef shape, const ReadHf& read,
                         std::vector<std::string>& used);

// The HF tensors our tensor `name` becomes (none for a zero selection bias). ConfigError names a
// tensor no mapping exists for (a method's own tensors) or a non-zero selection bias.
NamedTensors export_tensor(const Arch& a, const std::string& name, const at::Tensor& t);

// HF tensors an import may leave unread (derived buffers such as rotary inv_freq; a tied head).
bool ignorable_hf_tensor(const std::string& hf_name, bool tied);

}  // namespace mf::hf
