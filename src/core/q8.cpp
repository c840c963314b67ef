#include "core/q8.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace mf {
namespace {

// the scales of an int8 weight's storage: after its values, 36 bytes of storage per block
const float* storage_scales(const at::Tensor& w) {
  const auto bytes = static_cast<int64_t>(w.storage().nbytes());
  TORCH_CHECK(w.scalar_type() == at::kChar && bytes % (kQ8Block + 4) == 0, "an int8 weight ", w.sizes(),
              " without its block scales (only `--dtype int8` makes them)");
  const int64_t values = bytes / (kQ8Block + 4) * kQ8Block;
  return reinterpret_cast<const float*>(static_cast<const char*>(w.storage().data()) + values);
}

}  // namespace

bool q8_holds(const at::Tensor& w) {
  return w.dim() >= 1 && w.size(-1) % kQ8Block == 0 && at::isFloatingType(w.scalar_type());
}

at::Tensor q8_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const int64_t values = c10::multiply_integers(sizes);
  TORCH_CHECK(sizes.size() >= 1 && sizes.back() % kQ8Block == 0, "int8 weights: rows of ", sizes,
              " do not split into blocks of ", kQ8Block);
  auto storage = at::empty({values / kQ8Block * (kQ8Block + 4)}, options.dtype(at::kChar));
  return storage.as_strided(sizes, c10::contiguous_strides(sizes), 0);
}

void q8_quantize(at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.sizes() == src.sizes() && dst.is_contiguous() && dst.storage_offset() == 0,
              "q8_quantize: ", src.sizes(), " into ", dst.sizes());
  const auto from = src.to(at::kFloat).contiguous();
  const float* x = from.data_ptr<float>();
  auto* q = dst.data_ptr<int8_t>();
  auto* scale = const_cast<float*>(storage_scales(dst));
  at::parallel_for(0, src.numel() / kQ8Block, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const float* xb = x + b * kQ8Block;
      float amax = 0;
      for (int64_t i = 0; i < kQ8Block; ++i) amax = std::max(amax, std::fabs(xb[i]));
      const float s = amax / 127.0f, inv = s > 0 ? 1.0f / s : 0.0f;
      scale[b] = s;
      for (int64_t i = 0; i < kQ8Block; ++i) q[b * kQ8Block + i] = static_cast<int8_t>(std::nearbyint(xb[i] * inv));
    }
  });
  dst.unsafeGetTensorImpl()->bump_version();
}

Q8Rows q8_of(const at::Tensor& w) {
  const int64_t ld = w.dim() >= 2 ? w.stride(-2) : w.size(-1);
  TORCH_CHECK(w.dim() >= 1 && w.stride(-1) == 1 && w.storage_offset() % kQ8Block == 0 && ld % kQ8Block == 0,
              "an int8 weight view ", w.sizes(), " (strides ", w.strides(), ", offset ", w.storage_offset(),
              ") whose rows do not start on its blocks of ", kQ8Block);
  int64_t last = w.storage_offset();  // the view's last byte
  for (int64_t d = 0; d < w.dim(); ++d) last += (w.size(d) - 1) * w.stride(d);
  const int64_t values = static_cast<int64_t>(w.storage().nbytes()) / (kQ8Block + 4) * kQ8Block;
  TORCH_CHECK(w.numel() > 0 && last < values, "an int8 weight ", w.sizes(), " outside the values of its storage (",
              "a copy of an int8 weight loses its scales)");
  return {w.data_ptr<int8_t>(), storage_scales(w) + w.storage_offset() / kQ8Block};
}

void q8_widen_range(Q8Rows w, int64_t ldw, int64_t K, int64_t r0, int64_t r1, float* dst) {
  for (int64_t r = r0; r < r1; ++r) {
    const auto row = w.from(r * ldw);
    float* out = dst + r * K;
    for (int64_t k0 = 0; k0 < K; k0 += kQ8Block) {
      const float s = row.scale[k0 / kQ8Block];
      for (int64_t k = k0; k < std::min(K, k0 + kQ8Block); ++k) out[k] = static_cast<float>(row.q[k]) * s;
    }
  }
}

}  // namespace mf
