// LatentMoE (arXiv 2601.18089; shaping: arXiv 2610.14644; ../shared/specs/latentmoe.md): routed experts work in an
// l-wide latent space. Per MoE layer "l,m,N,K,ms": the router and a full-width shared SwiGLU
// expert (width ms) see x; the routed rows are projected down (W_down [l, d]) before the
// engine's dispatcher and bank, and the combined result is projected up (W_up [d, l]).
#pragma once
#include "core/config.h"
#include "model/moe_ffn.h"

namespace mf {

// [model.moe.latent]
struct LatentConfig : MethodSectionOf<LatentConfig> {
  std::string shapes;  // "l,m,N,K,ms" per MoE layer, ';'-separated (one entry = every MoE layer); "" = off
};

std::vector<MoELayerShape> parse_latent_shapes(const std::string& spec);  // throws ConfigError naming the key
std::string format_latent_shapes(const std::vector<MoELayerShape>& shapes);

class LatentExtension : public MoEExtension {
 public:
  explicit LatentExtension(const ModelConfig& c);
  void plan(std::map<int64_t, MoELayerShape>& shapes) override;
  void attach(MoEFeedForward& slot) override;
  at::Tensor units_input(const MoEFeedForward& slot, const at::Tensor& x_TD) override;
  at::Tensor units_output(const MoEFeedForward& slot, const at::Tensor& y_TZ) override;

 private:
  struct Projections {
    torch::nn::Linear down{nullptr};  // W_down [l, d] (mlp.latent_down.weight)
    OutputLinear up;                  // W_up [d, l] (mlp.latent_up.weight)
  };
  int64_t d_model_;
  std::vector<MoELayerShape> spec_;
  std::map<int64_t, Projections> projections_;  // by block
};

// Registers [model.moe.latent] (and the old string key model.moe.latent), its validation and
// the MoE extension.
void register_latent();

}  // namespace mf
