// GCC vectors of W floats (and of the bf16, int8 and integer lanes beside them) and bf16 widened to
// float32 in them: shared by core/bf16.cpp (rounding, widening) and core/row_kernel.cpp.
#pragma once
#include <cstdint>

#include "core/simd.h"

namespace mf {

// the vector types of W lanes
template <int W>
struct Bf16Lanes {
  typedef float Vec __attribute__((vector_size(W * sizeof(float)), aligned(4), may_alias));
  typedef uint16_t Half __attribute__((vector_size(W * sizeof(uint16_t)), aligned(2), may_alias));
  typedef uint32_t Bits __attribute__((vector_size(W * sizeof(uint32_t))));
  typedef int8_t Bytes __attribute__((vector_size(W), aligned(1), may_alias));
  typedef int32_t Ints __attribute__((vector_size(W * sizeof(int32_t))));
  typedef int16_t Shorts __attribute__((vector_size(W * sizeof(int16_t))));
  typedef int32_t Words __attribute__((vector_size(W * sizeof(int32_t)), aligned(1), may_alias));
};

MF_ALWAYS_INLINE float bf16_value(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

// W bf16 numbers from p as float32: each one's bits moved to the top half of a 32-bit lane
template <int W>
MF_ALWAYS_INLINE typename Bf16Lanes<W>::Vec widen_lanes(const uint16_t* p) {
  using L = Bf16Lanes<W>;
  const typename L::Bits bits = __builtin_convertvector(*reinterpret_cast<const typename L::Half*>(p), typename L::Bits)
                                << 16;
  return (typename L::Vec)bits;  // a cast between vectors of one size keeps the bits
}

}  // namespace mf
