// A linear map without bias on our unit GEMMs (moe/unit_gemm.h), for the router's scores:
//   y_TE = x_TD W_ED^T,   dx_TD = dy_TE W_ED,   dW_ED = dy_TE^T x_TD
// threads taking rows of y and dx, and rows of dW (its sum over tokens in pieces of 512, so the
// products read by depth stay short). Where unit_gemm_preferred(x) does not hold (not float32 on
// the CPU, no AVX-512 unless pinned) or an operand is not contiguous, at::linear.
#pragma once
#include <ATen/ATen.h>

namespace mf {

at::Tensor tiles_linear(const at::Tensor& x_TD, const at::Tensor& w_ED);

}  // namespace mf
