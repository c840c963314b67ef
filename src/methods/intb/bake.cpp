#include <fmt/format.h>

#include <filesystem>
#include <set>

#include "io/checkpoint.h"
#include "io/model_io.h"
#include "methods/intb/intb.h"

namespace mf {

BakeReport bake_intb(const std::string& checkpoint, const std::string& out) {
  Config cfg = checkpoint_config(checkpoint);
  auto& section = cfg.model.moe.section<IntBConfig>();
  if (cfg.model.ffn != "intb") throw std::invalid_argument("bake: the checkpoint has no IntBMoE slots (model.ffn)");
  if (section.baked) throw std::invalid_argument("bake: the checkpoint is baked already");
  const bool vit = cfg.model.task == "classify";
  std::shared_ptr<torch::nn::Module> model;
  std::vector<std::shared_ptr<FeedForward>> ffns;
  if (vit) {
    auto l = load_classifier(checkpoint);
    ffns = l.model->feed_forwards();
    model = l.model.ptr();
  } else {
    auto l = load_model(checkpoint);
    ffns = l.model->feed_forwards();
    model = l.model.ptr();
  }
  BakeReport r;
  NamedTensors tensors;
  std::vector<std::string> slots;
  for (size_t i = 0; i < ffns.size(); ++i) {
    auto* s = dynamic_cast<IntBFeedForward*>(ffns[i].get());
    if (!s) continue;
    slots.push_back(fmt::format("{}{}.mlp.", vit ? "layers." : "model.layers.", i));
    for (auto& [name, t] : s->baked_tensors()) tensors.emplace_back(slots.back() + name, t);
    ++r.slots;
  }
  for (auto& [name, t] : model_tensors(*model)) {
    r.parameters_before += t.numel();
    bool in_slot = false;
    for (auto& p : slots) in_slot = in_slot || name.rfind(p, 0) == 0;
    if (!in_slot) tensors.emplace_back(name, t);
  }
  for (auto& [name, t] : tensors) r.parameters_after += t.numel();
  section.baked = true;
  auto ck = read_checkpoint(checkpoint);
  Metadata meta = ck.metadata();
  meta["moeforge.config"] = to_toml(cfg);
  meta["moeforge.intb_baked_from"] = ck.dir;
  const auto tokenizer = std::filesystem::exists(ck.tokenizer_path()) ? ck.tokenizer_path() : "";
  write_checkpoint(out, {tensors, {}, meta, ck.trainer_state(), tokenizer});
  return r;
}

}  // namespace mf
