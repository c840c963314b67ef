#include "model/method_info.h"

namespace mf {
namespace {

std::vector<MethodInfo>& infos() {
  static std::vector<MethodInfo> all;
  return all;
}

}  // namespace

void register_method_info(MethodInfo info) {
  for (auto& m : infos())
    if (m.key == info.key) throw std::logic_error("method \"" + info.key + "\" registered twice");
  infos().push_back(std::move(info));
}

std::vector<const MethodInfo*> methods_enabled(const Config& c) {
  std::vector<const MethodInfo*> on;
  for (auto& m : infos())
    if (m.enabled && m.enabled(c)) on.push_back(&m);
  return on;
}

}  // namespace mf
