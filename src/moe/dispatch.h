// The one dispatch engine: y[t] = sum over pairs p with token_P[p] = t of weight_P[p] * unit_{unit_P[p]}(x[t]).
// Stable sort by unit -> gather rows -> grouped unit computation -> weighted scatter-add (moe/combine.h).
#pragma once
#include <optional>

#include "moe/banks.h"
#include "moe/routing.h"

namespace mf {

struct DispatchOptions {
  double capacity_factor = 0;  // 0 = dropless; else each unit keeps ceil(cf * P / E) pairs
};

struct DispatchResult {
  at::Tensor y_TD;
  at::Tensor dropped;  // int64 scalar: pairs dropped by the capacity limit
};

// How dispatch runs a bank's units (one choice per call, made by units_path):
//   grouped   gather -> the bank's grouped units (hand-written backward) -> combine: banks
//             without a combined path, or pinned
//   combined  gather, units and combine chunk by chunk (moe/combined_ffn.h), training and
//             inference: banks that offer it (ExpertBank, ExpertBlocks)
//   fused     no grad, float32, a bank with packed weights: gather and combine inside the unit
//             GEMMs (moe/fused_units.h); unasked on AVX2 CPUs, and on AVX-512 ones for few
//             pairs a unit (fused_units_preferred: decoding, short prompts)
enum class UnitsPath { Grouped, Combined, Fused };
const char* to_string(UnitsPath path);
// the path for `pairs` (token, unit) pairs over the bank's units (0: a few, as in decoding)
UnitsPath units_path(const at::Tensor& x_TD, const UnitBank& bank, int64_t pairs = 0);
// Pins the path until reset (nullopt): tests and benchmarks compare paths. A pinned path the
// bank, grad mode or machine cannot take is an error at the next dispatch.
void force_units_path(std::optional<UnitsPath> path);

DispatchResult dispatch(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank, const DispatchOptions& opt = {});

// The unweighted unit output of every pair, grouped by unit: pair order_P[i] (a stable sort of
// the pairs by unit) gets out_PD[i] = unit_P(x[token_P]). dispatch() weights and scatters these;
// analyses that need each pair's own output (e.g. REAP saliency) read them directly.
struct PairOutputs {
  at::Tensor order_P, unit_P, out_PD;  // unit_P: the sorted units
};
PairOutputs pair_outputs(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank);

// Numerical ground truth: every unit on every token, combined with a dense [T, E] weight
// matrix that is zero where a token was not routed.
at::Tensor dense_reference(const at::Tensor& x_TD, const Assignment& a, UnitBank& bank);

}  // namespace mf
