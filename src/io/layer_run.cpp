#include "io/layer_run.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <set>

#include "model/moe_ffn.h"
#include "model/transformer.h"
#include "model/vit.h"

namespace mf {

LayerSlot build_layer_slot(const Config& cfg, int64_t layer, at::ScalarType dtype) {
  if (layer < 0 || layer >= cfg.model.n_layers)
    throw ConfigError(
        fmt::format("--layer {}: the model has blocks 0..{} (model.n_layers)", layer, cfg.model.n_layers - 1));
  LayerSlot s;
  std::vector<std::shared_ptr<FeedForward>> ffns;
  if (cfg.model.task == "classify") {
    VisionTransformer m(cfg.model);
    m->init_weights(static_cast<uint64_t>(cfg.train.seed));
    ffns = m->feed_forwards();
    s.model = m.ptr();
  } else {
    ModelConfig c = cfg.model;
    if (c.vocab_size <= 0) c.vocab_size = 2;  // the embedding is never used here
    TransformerLM m(c);
    m->init_weights(static_cast<uint64_t>(cfg.train.seed));
    ffns = m->feed_forwards();
    s.model = m.ptr();
  }
  s.model->to(dtype);
  s.slot = ffns.at(static_cast<size_t>(layer));
  for (auto& p : s.slot->named_parameters()) s.tensors.emplace_back(p.key(), p.value());
  for (auto& b : s.slot->named_buffers()) s.tensors.emplace_back(b.key(), b.value());
  if (auto moe = std::dynamic_pointer_cast<MoEFeedForward>(s.slot)) {
    bool own = false;
    for (auto& [name, t] : s.tensors) own = own || name.rfind("experts.", 0) == 0;
    if (!own)  // a pool registered on another block
      for (auto& p : moe->experts->named_parameters()) s.tensors.emplace_back("experts." + p.key(), p.value());
  }
  return s;
}

void load_layer_weights(LayerSlot& s, const SafetensorsData& w, const std::string& source) {
  torch::NoGradGuard g;
  std::set<std::string> names;
  for (auto& [name, t] : s.tensors) {
    names.insert(name);
    auto it = w.tensors.find(name);
    if (it == w.tensors.end())
      throw FormatError(fmt::format("{}: tensor '{}' of shape {} is missing (`moeforge layer names` lists them)",
                                    source, name, c10::str(t.sizes())));
    if (it->second.sizes() != t.sizes())
      throw FormatError(fmt::format("{}: tensor '{}' has shape {}; the slot expects {}", source, name,
                                    c10::str(it->second.sizes()), c10::str(t.sizes())));
  }
  for (auto& [name, t] : w.tensors)
    if (!names.count(name)) throw FormatError(fmt::format("{}: tensor '{}' is not one of the slot's", source, name));
  for (auto& [name, t] : s.tensors) t.copy_(w.tensors.at(name));
}

NamedTensors run_layer(LayerSlot& s, const at::Tensor& x, const at::Tensor& dy) {
  const auto dtype = s.tensors.empty() ? x.scalar_type() : s.tensors.front().second.scalar_type();
  const bool grads = dy.defined();
  if (grads && dy.sizes() != x.sizes())
    throw FormatError(fmt::format("dy has shape {}; it must match x {}", c10::str(dy.sizes()), c10::str(x.sizes())));
  s.slot->train(grads);  // with gradients: the training path (e.g. IntBMoE composes per forward)
  auto xin = x.detach().to(dtype).clone().requires_grad_(grads);
  AuxLosses aux;
  at::Tensor y;
  {
    torch::AutoGradMode mode(grads);
    y = s.slot->forward(xin, aux);
  }
  NamedTensors out = {{"y", y.detach()}};
  if (!grads) return out;
  for (auto& [name, t] : s.tensors)
    if (t.requires_grad()) t.mutable_grad() = at::Tensor();
  (y * dy.to(y.dtype())).sum().backward();
  out.emplace_back("dx", xin.grad());
  for (auto& [name, t] : s.tensors)
    if (t.requires_grad()) out.emplace_back("grad." + name, t.grad().defined() ? t.grad() : torch::zeros_like(t));
  return out;
}

NamedTensors example_layer_input(const Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.train.seed));
  auto x = torch::randn({1, 8, cfg.model.d_model});
  auto dy = torch::randn({1, 8, cfg.model.d_model});
  return {{"x", x}, {"dy", dy}};
}

at::Tensor tensor_from(const std::string& path, const std::string& name) {
  auto st = load_safetensors(path);
  auto it = st.tensors.find(name);
  if (it == st.tensors.end()) throw FormatError(fmt::format("{}: no tensor named \"{}\"", path, name));
  return it->second;
}

}  // namespace mf
