#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

#include "model/layers.h"
#include "model/rms_norm_rows.h"
#include "model/rope_rows.h"
#include "model/small_attention.h"
#include "train/kernel_case_parts.h"

namespace mf::cases {
namespace {

// The ViT's attention (packed projection, 17 tokens) and an LM's causal attention (the
// quickstart's heads, half as many kv heads, and windows; the test size has more than 64 keys)
// against matmul/softmax on k and v repeated per query head.
KernelCase attention_case(CaseSize size, at::ScalarType dtype, bool causal) {
  const bool perf = size == CaseSize::Perf;
  const int64_t B = causal ? (perf ? 16 : 2) : (perf ? 128 : 3), H = causal ? (perf ? 8 : 4) : 4, Hkv = H / 2;
  const int64_t N = causal ? (perf ? 128 : 70) : 17, Dh = causal ? (perf ? 32 : 8) : (perf ? 24 : 8);
  auto qkv = input({B, N, 3, H, Dh}, dtype, true), up = input({B, N, H, Dh}, dtype);
  const auto heads = [=] { return qkv.permute({2, 0, 3, 1, 4}); };           // [3, B, H, N, Dh]
  const auto kv = [=](const at::Tensor& t) { return t.narrow(1, 0, Hkv); };  // causal: Hkv heads
  KernelCase c{causal ? "causal attention, fwd+bwd" : "small attention, fwd+bwd",
               causal ? fmt::format("B={} H={} Hkv={} N={} Dh={}", B, H, Hkv, N, Dh)
                      : fmt::format("B={} H={} N={} Dh={}", B, H, N, Dh),
               (causal ? 6.0 : 12.0) * B * H * N * N * Dh, 1e-5};
  c.ours = [=] {
    return forward_backward(
        [=] {
          if (!causal) return small_attention_packed(qkv, false);
          const auto h = heads();
          return small_attention(h[0], kv(h[1]), kv(h[2]), true).transpose(1, 2);
        },
        {qkv}, up);
  };
  c.reference = [=] {
    return forward_backward(
        [=] {
          const auto h = heads();
          const auto k = causal ? kv(h[1]).repeat_interleave(H / Hkv, 1) : h[1];
          const auto v = causal ? kv(h[2]).repeat_interleave(H / Hkv, 1) : h[2];
          auto s = torch::matmul(h[0], k.transpose(-2, -1)) / std::sqrt(static_cast<double>(Dh));
          if (causal) s = s.masked_fill(torch::ones({N, N}, torch::kBool).triu(1), -INFINITY);
          return torch::matmul(torch::softmax(s, -1), v).transpose(1, 2);
        },
        {qkv}, up);
  };
  return c;
}

// RMSNorm over the quickstart's [tokens, d] activations, against pow/mean/rsqrt/products
KernelCase rms_norm_case(CaseSize size, at::ScalarType dtype) {
  const bool perf = size == CaseSize::Perf;
  const int64_t T = perf ? 2048 : 37, D = perf ? 256 : 40;
  auto x = input({T, D}, dtype, true), w = input({D}, dtype, true), up = input({T, D}, dtype);
  KernelCase c{"RMSNorm, fwd+bwd", fmt::format("T={} D={}", T, D), 11.0 * T * D, 1e-5};
  c.ours = [=] { return forward_backward([=] { return rms_norm_rows(x, w, 1e-5); }, {x, w}, up); };
  c.reference = [=] { return forward_backward([=] { return rms_norm_composed(x, w, 1e-5); }, {x, w}, up); };
  return c;
}

// Rotary embeddings on q as the attention hands it over ([B, T, H, Dh] viewed as [B, H, T, Dh]),
// against narrow/cat/products
KernelCase rope_case(CaseSize size, at::ScalarType dtype) {
  const bool perf = size == CaseSize::Perf;
  const int64_t B = perf ? 16 : 2, H = perf ? 8 : 3, T = perf ? 128 : 9, Dh = perf ? 32 : 10;
  const RopeTable table(T, Dh, 10000.0);
  const auto cos = table.cos.to(dtype), sin = table.sin.to(dtype);
  auto x = input({B, T, H * Dh}, dtype, true), up = input({B, H, T, Dh}, dtype);
  const auto q = [=] { return x.view({B, T, H, Dh}).transpose(1, 2); };
  KernelCase c{"rotary embeddings, fwd+bwd", fmt::format("B={} H={} T={} Dh={}", B, H, T, Dh), 6.0 * B * H * T * Dh,
               1e-6};
  c.ours = [=] { return forward_backward([=] { return rope_rows(q(), cos, sin); }, {x}, up); };
  c.reference = [=] { return forward_backward([=] { return rope_composed(q(), cos, sin); }, {x}, up); };
  return c;
}

}  // namespace

std::vector<KernelCase> model_kernel_cases(CaseSize size, at::ScalarType dtype) {
  return {attention_case(size, dtype, false), attention_case(size, dtype, true), rms_norm_case(size, dtype),
          rope_case(size, dtype)};
}

}  // namespace mf::cases
