// A linear map on our unit GEMMs (core/unit_gemm.h), for the model's projections and the
// router's scores, x [..., D] as rows x_TD:
//   y_TE = x_TD W_ED^T + b_E,   dx_TD = dy_TE W_ED,   dW_ED = dy_TE^T x_TD,   db_E = sum_t dy_TE
// threads taking rows of y and dx, and rows of dW (its sum over tokens in pieces of 512, so the
// products read by depth stay short). Each row of y and dx, and each entry of dW, is summed in
// one order whatever the thread count. at::linear where unit_gemm_preferred(x) does not hold
// (not float32 on the CPU; no AVX-512 unless pinned), for fewer than 32 rows (the packing of W
// would cost more than it saves) and for weights or biases that are not float32 and contiguous.
#pragma once
#include <ATen/ATen.h>

namespace mf {

at::Tensor tiles_linear(const at::Tensor& x, const at::Tensor& w_ED, const at::Tensor& b_E = {});

// Its backward's two products into the caller's tensors, x_TD [T, D] as rows: dx_TD = dy_TE W_ED
// and dW_ED = dy_TE^T x_TD (added to dW_ED when accumulate), for a hand-written backward such as
// the fused LM loss; LibTorch's products where tiles_linear would not take x.
void linear_grads_into(const at::Tensor& dy_TE, const at::Tensor& x_TD, const at::Tensor& w_ED, at::Tensor dx_TD,
                       at::Tensor dw_ED, bool accumulate);

}  // namespace mf
