// The diagnostics of UniF-MoE's motivation (paper section II), on a trained top-k MoE layer:
//   value alignment   c_ijh = cos(V_i[h,:], V_j[h,:]),  rho_ij(delta) = |{h : c_ijh >= delta}| / H
//                     (V_e[h,:] = column h of down_proj[e]), against the pair's co-activation
//                     frequency (share of tokens whose selected set holds both), Pearson r;
//   residual demand   for a token's top-2 pair (i, j) with renormalised weights s~: aligned
//                     positions S_ij, y = sum s~_e E_e(x), S = sum s~_e E_e^S(x), r = y - S;
//                     R_m = the residual-position outputs of the first m experts in a residual
//                     router's order; ridge a* = argmin ||a^T R_m - r||^2 + gamma_m ||a||^2,
//                     gamma_m = 1e-6 tr(R_m R_m^T) / m; e_m = ||S + a*^T R_m - y|| / max(||y||, 1e-12);
//                     k_eps = min{m : e_m <= eps}, K + 1 if none.
// The residual router: the paper freezes the experts and trains a new top-2 router on the
// residual positions; we fit one locally (see fit_residual_router), the layer's router as start.
#pragma once
#include <ATen/ATen.h>

#include "moe/banks.h"

namespace mf {

// [E, E, H] bool: position h of pair (i, j) is aligned (diagonal: all true)
at::Tensor aligned_positions(const ExpertBank& bank, double delta);
// [E, E]: rho_ij, the aligned share of the H positions
at::Tensor value_alignment(const ExpertBank& bank, double delta);
// [E, E]: share of the T tokens whose pairs (token_P, unit_P) include both i and j
at::Tensor coactivation(const at::Tensor& token_P, const at::Tensor& unit_P, int64_t tokens, int64_t experts);
double pearson(const std::vector<double>& x, const std::vector<double>& y);

// Each expert's output on x_TD split by the pair's positions: E_e^{R_ij}(x) for every e ([T, E, D],
// no bias) plus y and S of the token's pair (pair_T2, weights_T2 renormalised; output biases go with S).
struct ResidualSplit {
  at::Tensor residual_TED, y_TD, shared_TD;
};
ResidualSplit split_residual(const ExpertBank& bank, const at::Tensor& aligned_EEF, const at::Tensor& x_TD,
                             const at::Tensor& pair_T2, const at::Tensor& weights_T2);

// A top-2 router over the residual outputs, fitted to reproduce y: minimises
// mean_t ||S + sum_{e in top2} p~_e E_e^R(x) - y||^2 (p~: softmax over the two selected logits)
// with Adam from `start` [E, D]; returns its weight.
at::Tensor fit_residual_router(const at::Tensor& x_TD, const ResidualSplit& s, const at::Tensor& start, int64_t steps,
                               double lr);

// k_eps per token for experts ordered by order_TE (descending preference) -> int64 [T] in 1..E+1
at::Tensor residual_demand(const ResidualSplit& s, const at::Tensor& order_TE, double eps);

}  // namespace mf

#include <nlohmann/json.hpp>

#include "train/evaluable.h"

namespace mf {

struct DiagnoseOptions {
  double delta = 0.98, epsilon = 0.05;
  int64_t tokens = 4096;  // tokens captured per MoE layer
  int64_t fit_steps = 300;
  double fit_lr = 1e-2;
  std::string split = "val";
};

struct LayerDiagnosis {
  int64_t layer = 0;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // i < j
  std::vector<double> rho, coactivation;           // per pair
  double pearson = NAN;
  // residual demand (top-2 layers only): histogram of k_eps over 1..E+1, mean, the share of tokens
  // whose fitted residual router keeps the original top-2 set, and per pair the mean k_eps
  std::vector<int64_t> k_histogram;
  double mean_k = NAN, kept_top2 = NAN, rho_vs_pair_k = NAN;
};

// Captures up to opt.tokens routed tokens per MoE layer on opt.split and measures both diagnostics.
std::vector<LayerDiagnosis> diagnose_motivation(const Evaluable& model, const DiagnoseOptions& opt);
// PREFIX_alignment.svg (rho vs co-activation), PREFIX_demand.svg (CDF of k_eps), PREFIX.json; the paths
std::vector<std::string> write_diagnosis(const std::vector<LayerDiagnosis>& d, const std::string& prefix,
                                         const std::string& title);

}  // namespace mf
