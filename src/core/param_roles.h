// Parameter roles, declared once by the module that owns the parameter; weight init and
// the optimizer's decay groups both read them (no matching on name suffixes).
#pragma once
#include <torch/nn/module.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mf {

enum class ParamRole {
  Weight,        // normal(0, init_std), weight decay
  Output,        // a projection into the residual stream: normal(0, init_std / sqrt(2 n_layers)), decay
  Gain,          // norm weights and learnable scales: ones, no decay
  Bias,          // zeros, no decay
  Embedding,     // normal(0, init_std), decay only with train.decay_embeddings
  Orthonormal,   // a [N, D] weight with orthonormal rows when N <= D (else orthonormal columns), decay
  FanInUniform,  // U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = the last dimension (PyTorch's Linear default), decay
  UnitNormal,    // normal(0, 1) (PyTorch's Embedding default; IntBMoE's codebook), decay
  Scale,         // a learnable scale the module initialises itself (a config value); left as built, no decay
};

using ParamRoleList = std::vector<std::pair<std::string, ParamRole>>;  // local name -> role

// Implemented by modules whose parameters are not all plain weights.
class DeclaresParamRoles {
 public:
  virtual ~DeclaresParamRoles() = default;
  virtual ParamRoleList param_roles() const = 0;
};

// Full parameter name -> role for every parameter under `root` (Weight when undeclared).
std::map<std::string, ParamRole> collect_param_roles(const torch::nn::Module& root);

}  // namespace mf
