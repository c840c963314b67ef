#include "methods/latent/latent.h"

#include <fmt/format.h>

#include <sstream>

#include "core/config_keys.h"
#include "model/method_info.h"

namespace mf {

std::vector<MoELayerShape> parse_latent_shapes(const std::string& spec) {
  std::vector<MoELayerShape> out;
  std::stringstream ss(spec);
  for (std::string entry; std::getline(ss, entry, ';');) {
    if (entry.find_first_not_of(" \t") == std::string::npos) continue;
    std::vector<int64_t> v;
    std::stringstream es(entry);
    try {
      for (std::string item; std::getline(es, item, ',');) {
        size_t used = 0;
        v.push_back(std::stoll(item, &used));
        if (item.find_first_not_of(" \t", used) != std::string::npos) throw std::invalid_argument(item);
      }
    } catch (const std::exception&) {
      v.clear();
    }
    if (v.size() != 5 || v[0] < 1 || v[1] < 1 || v[2] < 1 || v[3] < 1 || v[3] > v[2] || v[4] < 0)
      throw ConfigError(
          fmt::format("model.moe.latent.shapes: entry \"{}\" must be l,m,N,K,ms with positive l, m, N, "
                      "1 <= K <= N and ms >= 0",
                      entry));
    out.push_back({v[0], v[1], v[2], v[3], v[4], v[2]});
  }
  return out;
}

std::string format_latent_shapes(const std::vector<MoELayerShape>& shapes) {
  std::string s;
  for (auto& x : shapes)
    s += fmt::format("{}{},{},{},{},{}", s.empty() ? "" : "; ", x.latent, x.expert_hidden, x.num_experts, x.top_k,
                     x.shared_hidden);
  return s;
}

LatentExtension::LatentExtension(const ModelConfig& c)
    : d_model_(c.d_model), spec_(parse_latent_shapes(c.moe.section<LatentConfig>().shapes)) {}

void LatentExtension::plan(std::map<int64_t, MoELayerShape>& shapes) {
  if (spec_.size() != 1 && spec_.size() != shapes.size())
    throw ConfigError(
        fmt::format("model.moe.latent.shapes has {} entries; give 1 (all MoE layers) or {} (one per MoE "
                    "layer, model.moe.layers)",
                    spec_.size(), shapes.size()));
  size_t i = 0;
  for (auto& [layer, s] : shapes) s = spec_.size() == 1 ? spec_[0] : spec_[i++];
}

void LatentExtension::attach(MoEFeedForward& slot) {
  const int64_t l = slot.shape().latent;
  using torch::nn::LinearOptions;
  Projections p;
  p.down = slot.register_module("latent_down", torch::nn::Linear(LinearOptions(d_model_, l).bias(false)));
  p.up = slot.register_module("latent_up", std::make_shared<OutputLinearImpl>(l, d_model_));
  projections_[slot.layer] = p;
}

at::Tensor LatentExtension::units_input(const MoEFeedForward& slot, const at::Tensor& x_TD) {
  return projections_.at(slot.layer).down->forward(x_TD);
}

at::Tensor LatentExtension::units_output(const MoEFeedForward& slot, const at::Tensor& y_TZ) {
  return projections_.at(slot.layer).up->forward(y_TZ);
}

namespace {

void validate_latent(const Config& c) {
  const auto& spec = c.model.moe.section<LatentConfig>().shapes;
  if (spec.empty()) return;
  if (c.model.ffn != "moe") throw ConfigError("model.moe.latent.shapes needs model.ffn = \"moe\"");
  if (c.model.moe.n_shared > 0)
    throw ConfigError("model.moe.latent.shapes sets each layer's shared expert (ms); model.moe.n_shared must be 0");
  for (auto& s : parse_latent_shapes(spec))
    if (s.latent > c.model.d_model)
      throw ConfigError(fmt::format("model.moe.latent.shapes: latent width {} exceeds model.d_model ({})", s.latent,
                                    c.model.d_model));
}

}  // namespace

void register_latent() {
  register_config_keys({key_at<std::string>(
      "model.moe.latent.shapes", [](Config & c) -> auto& { return c.model.moe.section<LatentConfig>().shapes; },
      "LatentMoE shapes \"l,m,N,K,ms\" per MoE layer, ';'-separated (one entry = all layers): latent width l, expert "
      "width m, experts N, top-k K, shared full-width expert width ms; replaces num_experts/top_k/expert_hidden "
      "(\"\" = off)")});
  register_config_alias("model.moe.latent", "model.moe.latent.shapes");
  register_config_validator(validate_latent);
  register_moe_extension("latent", [](const ModelConfig& c) -> std::shared_ptr<MoEExtension> {
    if (c.moe.section<LatentConfig>().shapes.empty()) return nullptr;
    return std::make_shared<LatentExtension>(c);
  });
  MethodInfo info{"latent", "LatentMoE", "LatentMoE routing",
                  "Experts work in latent shapes (model.moe.latent.shapes)."};
  info.facts = {"model.moe.latent.shapes"};
  info.enabled = [](const Config& c) { return !c.model.moe.section<LatentConfig>().shapes.empty(); };
  register_method_info(std::move(info));
}

}  // namespace mf
