#include "moe/combine.h"

#include <ATen/AccumulateType.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstring>

#include "core/simd.h"

namespace mf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The first cache lines of a row of n values (the hardware's prefetchers take the rest once the
// row is being read). Rows of x and y are where the next pair's token points: nothing predicts
// them, and the GEMMs between two chunks have evicted them. Isolated, with the cache flushed
// between chunks, prefetching 8 lines took 20 % off a combine and 8 % off a gather of 512-float
// rows (the whole row: the same and 4 %); in the finer MoE shape's training step, 4 % off the step.
template <typename T>
MF_ALWAYS_INLINE void prefetch_row(const T* row, int64_t n) {
  constexpr int64_t line = 64 / static_cast<int64_t>(sizeof(T));
  for (int64_t c = 0; c < std::min(n, 8 * line); c += line) __builtin_prefetch(row + c);
}

// Threads own token ranges and add whole rows in pair order: no two threads write one row, and
// the sum order is fixed (bitwise repeatable). Splitting the columns instead was 3x slower here:
// each thread's half rows pull the other half into its cache.
// No weights (weight null) = weight 1: the backward of gather_rows.
template <typename T>
MF_ALWAYS_INLINE void combine_tokens(const T* out, const int64_t* token, const T* weight, T* y, int64_t P, int64_t D,
                                     int64_t t0, int64_t t1) {
  for (int64_t p = 0; p < P; ++p) {
    const int64_t t = token[p];
    if (t < t0 || t >= t1) continue;
    if (p + 1 < P) prefetch_row(y + token[p + 1] * D, D);
    const T* o = out + p * D;
    T* row = y + t * D;
    const T w = weight ? weight[p] : T(1);
#pragma omp simd
    for (int64_t c = 0; c < D; ++c) row[c] += w * o[c];
  }
}
MF_SIMD_FUNCTION(combine_range, combine_tokens,
                 (const float* out, const int64_t* token, const float* weight, float* y, int64_t P, int64_t D,
                  int64_t t0, int64_t t1),
                 (out, token, weight, y, P, D, t0, t1))
MF_SIMD_FUNCTION(combine_range, combine_tokens,
                 (const double* out, const int64_t* token, const double* weight, double* y, int64_t P, int64_t D,
                  int64_t t0, int64_t t1),
                 (out, token, weight, y, P, D, t0, t1))

template <typename scalar_t>
void combine_cpu(const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P, at::Tensor& y_TD) {
  const int64_t P = out_PD.size(0), D = out_PD.size(1);
  const auto* out = out_PD.data_ptr<scalar_t>();
  const auto* token = token_P.data_ptr<int64_t>();
  const scalar_t* weight = weight_P.defined() ? weight_P.data_ptr<scalar_t>() : nullptr;
  auto* y = y_TD.data_ptr<scalar_t>();
  at::parallel_for(0, y_TD.size(0), 16,
                   [&](int64_t t0, int64_t t1) { combine_range(out, token, weight, y, P, D, t0, t1); });
}

// d_out[p] = w[p] dy[token[p]],  d_weight[p] = <out[p], dy[token[p]]> for pairs [p0, p1)
template <typename T>
MF_ALWAYS_INLINE void combine_backward_pairs(const T* dy, const T* out, const int64_t* token, const T* weight, T* dout,
                                             T* dweight, int64_t D, int64_t p0, int64_t p1) {
  using acc_t = at::acc_type<T, false>;
  for (int64_t p = p0; p < p1; ++p) {
    if (p + 1 < p1) prefetch_row(dy + token[p + 1] * D, D);
    const T w = weight[p];
    const T* g = dy + token[p] * D;
    const T* o = out + p * D;
    T* d = dout + p * D;
    acc_t dot = 0;
#pragma omp simd reduction(+ : dot)  // lets the compiler vectorise the sum (it may not reorder one otherwise)
    for (int64_t c = 0; c < D; ++c) {
      d[c] = w * g[c];
      dot += static_cast<acc_t>(o[c]) * static_cast<acc_t>(g[c]);
    }
    dweight[p] = static_cast<T>(dot);
  }
}
MF_SIMD_FUNCTION(combine_backward_range, combine_backward_pairs,
                 (const float* dy, const float* out, const int64_t* token, const float* weight, float* dout,
                  float* dweight, int64_t D, int64_t p0, int64_t p1),
                 (dy, out, token, weight, dout, dweight, D, p0, p1))
MF_SIMD_FUNCTION(combine_backward_range, combine_backward_pairs,
                 (const double* dy, const double* out, const int64_t* token, const double* weight, double* dout,
                  double* dweight, int64_t D, int64_t p0, int64_t p1),
                 (dy, out, token, weight, dout, dweight, D, p0, p1))

template <typename scalar_t>
void combine_backward_cpu(const at::Tensor& dy_TD, const at::Tensor& out_PD, const at::Tensor& token_P,
                          const at::Tensor& weight_P, at::Tensor& dout_PD, at::Tensor& dweight_P) {
  const int64_t D = out_PD.size(1);
  const auto* dy = dy_TD.data_ptr<scalar_t>();
  const auto* out = out_PD.data_ptr<scalar_t>();
  const auto* token = token_P.data_ptr<int64_t>();
  const auto* weight = weight_P.data_ptr<scalar_t>();
  auto* dout = dout_PD.data_ptr<scalar_t>();
  auto* dweight = dweight_P.data_ptr<scalar_t>();
  at::parallel_for(0, out_PD.size(0), 256, [&](int64_t p0, int64_t p1) {
    combine_backward_range(dy, out, token, weight, dout, dweight, D, p0, p1);
  });
}

struct Combine : public torch::autograd::Function<Combine> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& out_PD, const at::Tensor& token_P,
                            const at::Tensor& weight_P, int64_t T) {
    ctx->save_for_backward({out_PD, token_P, weight_P});
    auto y_TD = at::zeros({T, out_PD.size(1)}, out_PD.options());
    if (!out_PD.is_cpu()) return y_TD.index_add_(0, token_P, out_PD * weight_P.unsqueeze(1));
    AT_DISPATCH_FLOATING_TYPES(out_PD.scalar_type(), "combine",
                               [&] { combine_cpu<scalar_t>(out_PD, token_P, weight_P, y_TD); });
    return y_TD;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &out_PD = saved[0], &token_P = saved[1], &weight_P = saved[2];
    auto dy_TD = grads[0].contiguous();
    at::Tensor dout_PD, dweight_P;
    if (!out_PD.is_cpu()) {
      auto g_PD = dy_TD.index_select(0, token_P);
      dout_PD = g_PD * weight_P.unsqueeze(1);
      dweight_P = (g_PD * out_PD).sum(1);
    } else {
      dout_PD = at::empty_like(out_PD);
      dweight_P = at::empty_like(weight_P);
      AT_DISPATCH_FLOATING_TYPES(out_PD.scalar_type(), "combine_backward", [&] {
        combine_backward_cpu<scalar_t>(dy_TD, out_PD, token_P, weight_P, dout_PD, dweight_P);
      });
    }
    return {dout_PD, at::Tensor(), dweight_P, at::Tensor()};
  }
};

// rows_PD[p] = x_TD[token[p]], whole rows copied in parallel over pairs. LibTorch 1.13's CPU
// index_select took 29 ms for 52k rows of 384 floats on this machine (UniF-MoE's dispatch).
struct GatherRows : public torch::autograd::Function<GatherRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_TD, const at::Tensor& token_P) {
    ctx->save_for_backward({token_P});
    ctx->saved_data["T"] = x_TD.size(0);
    auto rows_PD = at::empty({token_P.numel(), x_TD.size(1)}, x_TD.options());
    gather_into(rows_PD, x_TD, token_P);
    return rows_PD;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto token_P = ctx->get_saved_variables()[0];
    const int64_t T = ctx->saved_data["T"].toInt();
    auto drows_PD = grads[0].contiguous();
    auto dx_TD = at::zeros({T, drows_PD.size(1)}, drows_PD.options());
    if (!drows_PD.is_cpu()) return {dx_TD.index_add_(0, token_P, drows_PD), at::Tensor()};
    AT_DISPATCH_FLOATING_TYPES(drows_PD.scalar_type(), "gather_rows_backward",
                               [&] { combine_cpu<scalar_t>(drows_PD, token_P, at::Tensor(), dx_TD); });
    return {dx_TD, at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_rows(const at::Tensor& x_TD, const at::Tensor& token_P) {
  TORCH_CHECK(x_TD.dim() == 2 && token_P.dim() == 1, "gather_rows: rows ", x_TD.sizes(), " and tokens ",
              token_P.sizes());
  return GatherRows::apply(x_TD.contiguous(), token_P.to(at::kLong).contiguous());
}

void gather_into(at::Tensor& rows_PD, const at::Tensor& x_TD, const at::Tensor& token_P) {
  RECORD_FUNCTION("mf::gather_rows", std::vector<c10::IValue>());
  if (!x_TD.is_cpu()) {
    at::index_select_out(rows_PD, x_TD, 0, token_P);
    return;
  }
  const auto* token = token_P.data_ptr<int64_t>();
  const auto bytes = static_cast<size_t>(x_TD.size(1)) * x_TD.element_size();
  const auto* x = static_cast<const char*>(x_TD.data_ptr());
  auto* rows = static_cast<char*>(rows_PD.data_ptr());
  at::parallel_for(0, token_P.numel(), 64, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      if (p + 1 < p1) prefetch_row(x + token[p + 1] * bytes, static_cast<int64_t>(bytes));
      std::memcpy(rows + p * bytes, x + token[p] * bytes, bytes);
    }
  });
}

void combine_into(at::Tensor& y_TD, const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P) {
  RECORD_FUNCTION("mf::combine", std::vector<c10::IValue>());
  if (!y_TD.is_cpu()) {
    y_TD.index_add_(0, token_P, weight_P.defined() ? out_PD * weight_P.unsqueeze(1) : out_PD);
    return;
  }
  AT_DISPATCH_FLOATING_TYPES(out_PD.scalar_type(), "combine_into",
                             [&] { combine_cpu<scalar_t>(out_PD, token_P, weight_P, y_TD); });
}

at::Tensor combine(const at::Tensor& out_PD, const at::Tensor& token_P, const at::Tensor& weight_P, int64_t T) {
  TORCH_CHECK(out_PD.dim() == 2 && token_P.numel() == out_PD.size(0) && weight_P.numel() == out_PD.size(0),
              "combine: ", out_PD.sizes(), " pair outputs with ", token_P.numel(), " tokens and ", weight_P.numel(),
              " weights");
  TORCH_CHECK(weight_P.scalar_type() == out_PD.scalar_type(), "combine: weights must have the outputs' dtype");
  return Combine::apply(out_PD.contiguous(), token_P.to(at::kLong).contiguous(), weight_P.contiguous(), T);
}

}  // namespace mf
