// One chunk of the combined path (moe/combined_ffn.h) with its products on core/unit_gemm.h:
// float32 on the CPU. The same equations as there, with no gathered or scattered copy
// of a row: x[token] and dy[token] are read through their tokens' pointers, y and dx are added
// into through theirs, W1's block rows and W2's block columns are read in place. Everything is
// reached by pointer: at the finer shape (E 128) a unit's tensor slices were ~50 LibTorch calls,
// 6,000 a training step (~0.5 us each: no time change was measurable). Internal to moe/.
#pragma once
#include <ATen/ATen.h>

#include "moe/unit_slices.h"

namespace mf {

// One chunk of unit u = (expert e, block b): n pairs (token, weight), x and the thread's y as
// [T, D] float32 rows.
struct TileChunk {
  const UnitSlices& units;
  size_t u;
  const float* gate_up;  // expert e's [2F|F, D]
  const float* down;     // expert e's [D, F]
  const float* b1;       // expert e's [2F|F], or null for none
  const float* b2;       // expert e's [D] (one block only), or null
  const float* x;
  int64_t D;
  const int64_t* token;
  const float* weight;
  int64_t n;
  float* workspace;  // unit_gemm_workspace(max(D, n, hidden)) floats
};

// y[token] += weight (act(x[token] W1^T + b1) W2^T + b2), keeping H [n, hidden] in h; a: [n, M] scratch
void tiles_forward(const TileChunk& c, float* h, float* a, float* y);

// combined_ffn.h's chunk backward from dy given H [n, hidden]: dweight [n] written, dW1 and
// dW2's slices of unit u written (first) or added to, db1, db2 (where defined) and dx[token]
// added to; g, wa: [n, M] and dh: [n, hidden] scratch
struct TileGrads {
  float* dweight;         // the chunk's [n]
  float *dw1, *dw2;       // expert e's, laid out as gate_up and down
  at::Tensor &db1, &db2;  // [E, 2F|F], [E, D], or undefined
  bool first;             // the unit's first chunk
  float* dx;              // the thread's [T, D]
};
void tiles_backward(const TileChunk& c, const float* h, const float* dy, const TileGrads& d, float* g, float* wa,
                    float* dh);

}  // namespace mf
