// What the shared commands need to know about a method, registered by the method's own folder
// (methods/methods.cpp), so io/, analysis/ and cli/ hold no method names: the run report's
// routing panel, the config keys it lists as facts, and `info`'s cost accounting.
#pragma once
#include <nlohmann/json.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"

namespace mf {

class FeedForward;
using FeedForwards = std::vector<std::shared_ptr<FeedForward>>;

struct MethodInfo {
  MethodInfo(std::string key, std::string name, std::string panel, std::string note)
      : key(std::move(key)), name(std::move(name)), panel(std::move(panel)), note(std::move(note)) {}
  std::string key;                          // short name: `info` prints its accounting under it ("unif")
  std::string name;                         // the report's name for it ("UniF-MoE")
  std::string panel;                        // the report's routing panel title
  std::string note;                         // one sentence under the panel
  std::string units = "experts per token";  // what the usage histogram counts
  bool pooled = false;                      // its layers route into shared pools
  std::vector<std::string> facts;           // config keys the report lists
  std::function<bool(const Config&)> enabled;
  // `info`: its costs on a model built from the config (its FFN slots, in block order); null = none
  std::function<nlohmann::json(const Config&, const FeedForwards&)> accounting;
};

void register_method_info(MethodInfo info);
// Every registered method the config enables, in registration order.
std::vector<const MethodInfo*> methods_enabled(const Config& c);

}  // namespace mf
