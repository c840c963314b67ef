// `moeforge info`: what a checkpoint (ours or a Hugging Face directory) holds, from its config
// and tensor headers only: architecture, parameter counts (the structure built block by block
// when blocks share nothing), the MoE layout, each enabled method's accounting
// (model/method_info.h), and every tensor's dtype and shape.
#pragma once
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "io/safetensors.h"

namespace mf {

struct CheckpointInfo {
  nlohmann::json summary;
  std::map<std::string, SafetensorsHeader::Entry> tensors;
};

CheckpointInfo checkpoint_info(const std::string& path);

}  // namespace mf
