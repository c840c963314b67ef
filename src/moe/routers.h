// Routers: token states x_TD -> Assignment, in three steps: score (logits -> scores_TE),
// select (which units each token gets), weight (the combine weight of each pair). All router
// math runs in float32 (float64 when x is float64, for tests). Losses follow
// ../shared/specs/baselines.md; NormRouter follows ../shared/specs/unipool.md.
#pragma once
#include <torch/nn/module.h>

#include "core/config.h"
#include "core/param_roles.h"
#include "moe/routing.h"

namespace mf {

struct RouterOptions {
  RouterKind kind = RouterKind::SoftmaxTopK;
  int64_t num_experts = 8;
  int64_t top_k = 2;
  bool renormalize = true;       // divide selected weights by their sum
  double top_p = 0.5;            // cumulative-mass threshold for top_p
  double aux_loss_coef = 1e-2;   // Switch aux loss alpha (0 = off)
  double z_loss_coef = 1e-3;     // router z-loss beta (0 = off)
  double seq_aux_loss_coef = 0;  // sequence-wise balance loss alpha (DeepSeek-V3; 0 = off)
  double bias_update = 0.0;      // DeepSeek-V3 aux-free bias step gamma (0 = off)
  uint64_t seed = 0;             // uniform_random router
  double norm_eps = 1e-8;        // norm_topk: added to ||z||_2
  double gate_scale = 0;         // > 0: weights times a learnable scalar initialised to this
};

// NormRouter calibration c(M, k) = E_x[ 1 / ||topk(ReLU(x / ||x||))||_2 ], x ~ N(0, I_M),
// estimated from 1e5 samples of a fixed-seed generator (SplitMix64 + Box-Muller, so the
// value is the same on every machine and LibTorch version); samples with no positive entry
// are skipped. Computed once per (M, k) and cached.
double norm_router_constant(int64_t num_experts, int64_t top_k, int64_t samples = 100000);
// s = sigma * c * ReLU(z / (||z||_2 + eps)); the norm runs over all E logits before the ReLU.
at::Tensor norm_router_scores(const at::Tensor& logits_TE, const at::Tensor& sigma, double c, double eps);

// L_aux = alpha * E * sum_i f_i P_i; f_i = share of pairs routed to i (no grad), P_i = mean_t p_ti
at::Tensor switch_aux_loss(const at::Tensor& probs_TE, const at::Tensor& unit_P, int64_t num_experts, double alpha);
// Sequence-wise (DeepSeek-V3): alpha * mean_s sum_i f_si P_si with f_si = E/(K L) * (pairs of
// sequence s routed to i), P_si = mean over the sequence's tokens of s'_ti, where s' are the
// router's scores normalised per token (softmax probs as they are; sigmoid affinities and
// NormRouter scores divided by their sum). Uniform routing gives alpha.
at::Tensor sequence_aux_loss(const at::Tensor& scores_TE, const at::Tensor& token_P, const at::Tensor& unit_P,
                             int64_t seq_len, int64_t top_k, double alpha);
// L_z = beta * mean_t logsumexp(z_t)^2 (from the logits, or from their logsumexp lse_T)
at::Tensor router_z_loss(const at::Tensor& logits_TE, double beta);
at::Tensor lse_z_loss(const at::Tensor& lse_T, double beta);
// smallest prefix of p sorted descending whose mass >= threshold: the number of units per token
at::Tensor top_p_counts(const at::Tensor& probs_TE, double threshold);

class RouterImpl : public torch::nn::Module, public DeclaresParamRoles {
 public:
  RouterImpl(int64_t d_model, RouterOptions opt);
  ParamRoleList param_roles() const override {
    return {{"norm_scale", ParamRole::Gain},
            {"gate_scale", ParamRole::Scale},
            {"weight", orthonormal_init ? ParamRole::Orthonormal : ParamRole::Weight}};
  }
  RouterOutput forward(const at::Tensor& x_TD);
  void set_sequence_length(int64_t seq_len) { seq_len_ = seq_len; }
  // DeepSeek-V3: b_i += gamma * sign(mean_load - load_i); call after the optimizer step.
  void update_selection_bias(const at::Tensor& load_E);
  const RouterOptions& options() const { return opt_; }

  at::Tensor weight;              // W_r [E, D]; registered by the MoE layer as "gate" -> mlp.gate.weight
  at::Tensor selection_bias;      // [E], selection only, not trained by gradient
  at::Tensor norm_scale;          // norm_topk: learnable sigma [1] (mlp.gate.norm_scale, no weight decay)
  double norm_constant = 1;       // norm_topk: c(E, k)
  at::Tensor gate_scale;          // options().gate_scale > 0: learnable s [1], w_P <- s w_P (mlp.gate.gate_scale)
  bool orthonormal_init = false;  // initialise `weight` with orthonormal rows (UniF-MoE's router)

 private:
  struct Scores {
    at::Tensor logits_TE, probs_TE;  // probs: softmax of the logits
    at::Tensor select_TE;            // what top-k selects on and weights come from
  };
  struct Selection {
    at::Tensor token_P, unit_P;
    at::Tensor index_TK;                    // top-k: the units of each token
    at::Tensor sorted_TE, keep_TE, rank_P;  // top-p: probs sorted per token, kept prefix, rank of pair p
  };
  at::Tensor logits(const at::Tensor& x_TD) const;
  Scores score(const at::Tensor& x_TD) const;
  Selection select(const Scores& s);
  Selection top_k_pairs(const at::Tensor& index_TK) const;  // top-k: pairs token-major
  at::Tensor weight_pairs(const Scores& s, const Selection& sel) const;

  RouterOptions opt_;
  int64_t seq_len_ = 0;  // tokens per sequence for the sequence-wise loss (set per call)
  int64_t calls_ = 0;
};
TORCH_MODULE(Router);

}  // namespace mf
