// Weights held in int8 blocks (`--dtype int8`, model/weight_dtype.h), computed in float32 as the
// bf16 ones are (core/bf16.h). The blocks are llama.cpp's q8_0: every 32 consecutive numbers of a
// row share a scale s = max|w| / 127 and are stored as round(w / s) in [-127, 127]; our scale is
// a float32 (q8_0's is a float16): 1.125 bytes a number against its 1.0625.
//
// Layout: an int8 tensor of the weight's shape whose storage holds, after its V values (V a
// multiple of 32), V / 32 float32 scales: the number at storage byte b is value[b] * scale[b / 32].
// A view (an expert's slice, a block of rows, 32-aligned columns) finds its scales through its
// storage, so every path that takes a weight tensor takes this one as it is. An int8 parameter
// is always such a weight; they are for inference only (no gradient, never saved).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mf {

inline constexpr int64_t kQ8Block = 32;

// Weights from q on: number i is q[i] * scale[i / 32] (q at the start of a block).
struct Q8Rows {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  Q8Rows from(int64_t i) const { return {q + i, scale + i / kQ8Block}; }  // i a multiple of 32
};

// A float tensor whose rows split into whole blocks (its last dimension a multiple of 32).
bool q8_holds(const at::Tensor& w);
// An int8 weight of these sizes, values and scales uninitialised.
at::Tensor q8_empty(at::IntArrayRef sizes, const at::TensorOptions& options);
// dst (from q8_empty, contiguous) = src quantised block by block.
void q8_quantize(at::Tensor& dst, const at::Tensor& src);
// The rows of an int8 weight view: contiguous rows, its first number and row stride on block
// boundaries (an error naming the shape otherwise).
Q8Rows q8_of(const at::Tensor& w);
// Rows [r0, r1) of w [.., K] (rows ldw apart) as float32 into dst [.., K] (contiguous).
void q8_widen_range(Q8Rows w, int64_t ldw, int64_t K, int64_t r0, int64_t r1, float* dst);

}  // namespace mf
