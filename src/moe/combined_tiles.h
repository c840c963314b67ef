// One chunk of the combined path (moe/combined_ffn.h) with its products on core/unit_gemm.h:
// float32 on the CPU. The same equations as there, with no gathered or scattered copy
// of a row: x[token] and dy[token] are read through their tokens' pointers, y and dx are added
// into through theirs, W1's block rows and W2's block columns are read in place. Internal to moe/.
#pragma once
#include <ATen/ATen.h>

#include "moe/unit_slices.h"

namespace mf {

// One chunk of unit u: n pairs (token, weight), x and the thread's y as [T, D] float32 rows.
struct TileChunk {
  const UnitSlices& units;
  size_t u;
  const at::Tensor &gate_up, &down;  // [E, 2F|F, D], [E, D, F]
  const at::Tensor &b1, &b2;         // [E, 2F|F], [E, D] (b2 with one block only), or empty for none
  const float* x;
  int64_t D;
  const int64_t* token;
  const float* weight;
  int64_t n;
  float* workspace;  // unit_gemm_workspace(max(D, n, hidden)) floats
};

// y[token] += weight (act(x[token] W1^T + b1) W2^T + b2), keeping H [n, hidden] in h; a: [n, M] scratch
void tiles_forward(const TileChunk& c, at::Tensor h, at::Tensor a, float* y);

// combined_ffn.h's chunk backward from dy given H [n, hidden]: dweight [n] written, dW1 and
// dW2's slices of unit u written (first) or added to, db1, db2 (where defined) and dx[token]
// added to; g, wa: [n, M] and dh: [n, hidden] scratch
struct TileGrads {
  at::Tensor dweight;  // the chunk's [n]
  at::Tensor &dw1, &dw2, &db1, &db2;
  bool first;  // the unit's first chunk
  float* dx;   // the thread's [T, D]
};
void tiles_backward(const TileChunk& c, const at::Tensor& h, const float* dy, const TileGrads& d, at::Tensor g,
                    at::Tensor wa, at::Tensor dh);

}  // namespace mf
