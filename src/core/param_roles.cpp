#include "core/param_roles.h"

namespace mf {

std::map<std::string, ParamRole> collect_param_roles(const torch::nn::Module& root) {
  std::map<std::string, ParamRole> roles;
  for (auto& p : root.named_parameters()) roles[p.key()] = ParamRole::Weight;
  for (auto& m : root.named_modules()) {
    auto* d = dynamic_cast<const DeclaresParamRoles*>(m.value().get());
    if (!d) continue;
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    for (auto& [name, role] : d->param_roles())
      if (auto it = roles.find(prefix + name); it != roles.end()) it->second = role;
  }
  return roles;
}

}  // namespace mf
