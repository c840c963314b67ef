#include "io/checkpoint_info.h"

#include <fmt/format.h>

#include <memory>
#include <set>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"
#include "io/safetensors_shards.h"
#include "model/method_info.h"
#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "model/vit.h"

namespace mf {

CheckpointInfo checkpoint_info(const std::string& path) {
  const Config cfg = checkpoint_config(path);
  const bool classifier = cfg.model.task == "classify";
  std::vector<std::shared_ptr<FeedForward>> ffns;
  ParamCounts c;
  // the structure without the weights; one block at a time when blocks share nothing
  const auto blockwise = classifier ? std::nullopt : blockwise_param_counts(cfg.model);
  if (blockwise) {
    c = *blockwise;
  } else if (classifier) {
    VisionTransformer model(cfg.model);
    ffns = model->feed_forwards();
    c = model->param_counts();
  } else {
    TransformerLM model(cfg.model);
    ffns = model->feed_forwards();
    c = model->param_counts();
  }
  const bool hf_dir = hf::is_hf_dir(path);
  const auto dir = hf_dir ? path : checkpoint_dir(path);
  std::unique_ptr<hf::HfDir> hf;
  std::unique_ptr<SafetensorsShards> file;  // the headers only
  std::map<std::string, SafetensorsHeader::Entry> tensors;
  Metadata meta;
  if (hf_dir) {
    hf = std::make_unique<hf::HfDir>(path);
    for (auto& n : hf->names()) tensors[n] = hf->entry(n);
    meta = {{"moeforge.architecture", "hf:" + hf->arch().model_type}, {"moeforge.step", "0"}};
  } else {
    file = std::make_unique<SafetensorsShards>(dir, "model");
    for (auto& n : file->names()) tensors[n] = file->entry(n);
    meta = file->metadata();
  }
  const auto& m = cfg.model;
  nlohmann::json j = {{"checkpoint", dir},
                      {"architecture", meta["moeforge.architecture"]},
                      {"step", parse_int(meta["moeforge.step"], "moeforge.step")},
                      {"vocab_size", m.vocab_size},
                      {"d_model", m.d_model},
                      {"n_layers", m.n_layers},
                      {"n_heads", m.n_heads},
                      {"n_kv_heads", m.n_kv_heads},
                      {"ffn", m.ffn},
                      {"ffn_hidden", m.ffn_hidden},
                      {"max_seq_len", m.max_seq_len},
                      {"parameters", c.total},
                      {"parameters_embedding", c.embedding},
                      {"parameters_non_embedding", c.non_embedding},
                      {"parameters_active_per_token", c.active},
                      {"task", m.task}};
  if (classifier) {
    j.erase("vocab_size");
    j.erase("max_seq_len");
    j["image_size"] = m.image_size;
    j["patch_size"] = m.patch_size;
    j["num_classes"] = m.num_classes;
  }
  if (m.ffn == "moe") {
    std::set<int64_t> per_router, banks;
    if (ffns.empty()) per_router.insert(m.moe.num_experts);  // blockwise: no shared banks
    for (auto& layer : moe_layers(ffns)) {
      per_router.insert(layer->shape().num_experts);
      if (layer->bank_group >= 0) banks.insert(layer->bank_group);
    }
    j["moe"] = {
        {"layers", m.moe.layers},
        {"num_experts", m.moe.num_experts},
        {"top_k", m.moe.top_k},
        {"expert_hidden", m.moe.expert_hidden},
        {"router", to_string(m.moe.router)},
        {"n_shared", m.moe.n_shared},
        {"shared_banks", banks.size()},
        {"experts_per_router",
         per_router.size() == 1 ? nlohmann::json(*per_router.begin()) : nlohmann::json(per_router)},
        {"expert_parameters_stored", c.expert_stored},
        {"router_parameters", c.router},
        {"expert_parameters_vanilla", c.expert_vanilla},
        {"expert_budget_fraction", c.expert_vanilla ? double(c.expert_stored) / double(c.expert_vanilla) : 0.0}};
  }
  for (const auto* method : methods_enabled(cfg))
    if (method->accounting) j[method->key] = method->accounting(cfg, ffns);
  return {j, tensors};
}

}  // namespace mf
