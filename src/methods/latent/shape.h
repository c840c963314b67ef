// LatentMoE accounting and shaping (../shared/specs/latentmoe.md).
// Per layer, with l the latent width (d when experts work on the full width):
//   P = N l m (routed params / 3), C = K l m (routed MACs per token / 3), V = K l (one-way
//   dispatch scalars per token), Q = 2 l + N + 3 ms (d Q = projections + router + shared expert;
//   the projections count whenever the layer has them, l > 0, l = d included: the model builds
//   them). Params = 3P + dQ, MACs per token = 3C + dQ.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"
#include "model/moe_ffn.h"

namespace mf {

struct LatentCost {
  double P = 0, C = 0, V = 0, Q = 0, params = 0, macs = 0;
};
LatentCost latent_cost(int64_t d_model, const MoELayerShape& s);

// (l, m) pairs with l * m == budget, both multiples of `multiple`, |l/m - 1| <= max_aspect_dev
// (the paper's rule: the bound is on l/m only), nearest to square first.
std::vector<std::pair<int64_t, int64_t>> near_square_shapes(int64_t budget, int64_t multiple, double max_aspect_dev);

// Accuracy-oriented LatentMoE scaling with compression alpha = d / l: l = d / alpha, N' = alpha N,
// K' = alpha K, m unchanged (same routed params, MACs and communication).
MoELayerShape scale_for_accuracy(int64_t d_model, const MoELayerShape& s, int64_t alpha);

// Constant-cost allocation: for latent width l, the layer matching the reference's C, P, V and Q:
//   m = C*/V*, K = V*/l, N = K P*/C*, ms = (Q* - 2l - N) / 3 (exact, before rounding),
// then rounded in turn (K >= 1; m = C*/(K l) to `multiple`; N = P*/(l m) >= K; ms to `multiple`),
// with every matched quantity's relative deviation.
struct SolvedShape {
  double m = 0, N = 0, K = 0, ms = 0;  // exact solution
  MoELayerShape rounded;
  LatentCost target, exact, achieved;
  double max_abs_deviation() const;  // largest relative deviation of P, C, V, Q after rounding
  std::string deviations() const;    // "P +0.0% C -1.2% V ..."
};
SolvedShape solve_constant_cost(int64_t d_model, const MoELayerShape& reference, int64_t latent, int64_t multiple);

// The two-segment allocation of `base`'s MoE blocks: those before `split` at latent width
// `narrow`, the rest at `wide`, each solved at the reference's cost.
struct TwoSegment {
  Config config;  // base with model.moe.latent.shapes set
  SolvedShape narrow, wide;
  std::string shapes() const;  // model.moe.latent.shapes
  std::string summary() const;
};
TwoSegment two_segment(const Config& base, int64_t split, const MoELayerShape& reference, int64_t narrow, int64_t wide,
                       int64_t multiple);

}  // namespace mf
