// core/unit_gemm.h (the register-tile products) against LibTorch's matmul in float64, and the
// combined training path on them (moe/combined_tiles.h) against the per-unit float64 reference,
// outputs and gradients. ctest runs these at every SIMD level (tests/CMakeLists.txt); the level
// this run took is printed.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "core/simd.h"
#include "core/tiles.h"
#include "core/unit_gemm.h"
#include "moe/banks.h"
#include "moe/combined_ffn.h"
#include "moe/dispatch.h"
#include "moe/fast_vs_reference.h"

using namespace mf;

namespace {

const char* level_name() {
  switch (simd_level()) {
    case SimdLevel::Avx512: return "AVX-512";
    case SimdLevel::Avx2: return "AVX2 + FMA";
    default: return "baseline x86-64";
  }
}

template <typename T>
std::vector<T*> rows_of(const at::Tensor& m) {  // [n, c] contiguous float32
  std::vector<T*> rows;
  for (int64_t i = 0; i < m.size(0); ++i) rows.push_back(m.data_ptr<float>() + i * m.size(1));
  return rows;
}

at::Tensor grad_of(const at::Tensor& t) { return t.defined() ? t.grad() : at::Tensor(); }

struct UnitGemmPin {  // pins unit_gemm on (any level) for a test, unpinned after
  UnitGemmPin() { force_unit_gemm(true); }
  ~UnitGemmPin() { force_unit_gemm(std::nullopt); }
};

}  // namespace

// the register transpose that packs B read by columns: v[i][l] = i W + l becomes l W + i
template <int W>
void expect_transposed() {
  typename tiles::Lanes<W>::Vec v[W];
  for (int i = 0; i < W; ++i)
    for (int l = 0; l < W; ++l) v[i][l] = static_cast<float>(i * W + l);
  tiles::transpose<W>(v);
  for (int i = 0; i < W; ++i)
    for (int l = 0; l < W; ++l)
      EXPECT_EQ(v[i][l], static_cast<float>(l * W + i)) << "W " << W << " at " << i << ", " << l;
}

TEST(UnitGemm, RegisterTransposeByHand) {
  expect_transposed<4>();
  expect_transposed<8>();
  expect_transposed<16>();
}

// C = scale * (A B + bias) (+ C): A read by rows or by depth, B by rows or by columns, with rows, columns
// and depths that are not whole tiles, panels or vectors (cols 50: AVX-512's one panel of 4 vectors,
// AVX2's panels of 2, with a 2-column tail; 1 column; depth 0 leaves C or zeros; 200 x 600 by depth:
// A's packed strips in blocks of 192 rows and 256 depths on AVX2 and baseline), against float64 matmul.
TEST(UnitGemm, EveryOperandLayoutMatchesMatmul) {
  std::cout << "unit_gemm variant: " << level_name() << std::endl;
  torch::manual_seed(21);
  for (auto [rows, cols, depth] : {std::tuple{13, 50, 37}, std::tuple{8, 48, 16}, std::tuple{1, 1, 3},
                                   std::tuple{25, 130, 9}, std::tuple{7, 5, 0}, std::tuple{200, 20, 600}})
    for (bool a_by_depth : {false, true})
      for (bool b_by_col : {false, true})
        for (bool accumulate : {false, true})
          for (int scaled_biased = 0; scaled_biased < 4; ++scaled_biased) {
            const bool scaled = scaled_biased & 1, biased = scaled_biased & 2;
            auto A = torch::randn({rows, depth}), B = torch::randn({depth, cols}), C0 = torch::randn({rows, cols});
            auto s = torch::rand({rows}) + 0.5, bias = torch::randn({cols});
            // the layouts the kernel reads: A or A^T, B or B^T, each row-major
            auto a_mem = (a_by_depth ? A.t() : A).contiguous(), b_mem = (b_by_col ? B.t() : B).contiguous();
            auto C = C0.clone();
            const auto a = rows_of<const float>(a_mem), b = rows_of<const float>(b_mem);
            const auto out = rows_of<float>(C);
            std::vector<float> ws(static_cast<size_t>(unit_gemm_workspace(depth)));
            unit_gemm({rows, cols, depth, a.data(), a_by_depth, b.data(), b_by_col, out.data(),
                       scaled ? s.data_ptr<float>() : nullptr, accumulate, biased ? bias.data_ptr<float>() : nullptr},
                      ws.data());
            auto ref = A.to(torch::kFloat64).matmul(B.to(torch::kFloat64));
            if (biased) ref = ref + bias.to(torch::kFloat64);
            if (scaled) ref = ref * s.to(torch::kFloat64).unsqueeze(1);
            if (accumulate) ref = ref + C0.to(torch::kFloat64);
            const double tol = 1e-5 * std::max(1, depth / 64);  // float32 sums of `depth` products
            EXPECT_TRUE(torch::allclose(C.to(torch::kFloat64), ref, tol, tol)) << fmt::format(
                "{}x{}x{} a_by_depth {} b_by_col {} accumulate {} scaled {}: max diff {}", rows, cols, depth,
                a_by_depth, b_by_col, accumulate, scaled, (C.to(torch::kFloat64) - ref).abs().max().item<double>());
          }
}

// The combined training path with its products on unit_gemm (float32) against the float64
// per-unit reference: outputs, dx, the pair weights', both weights' and the biases' gradients; blocks
// (W1's block rows in two ranges for SwiGLU, W2's block columns), chunks of 1, 3 and all rows
// (weight gradients written by a unit's first chunk, added to by the rest), an empty unit, units
// over a vector's width (F 40), 1 and 2 threads. Float32 against float64: each entry within 4x
// of the error LibTorch's float32 products make on the same call, or 1e-4 of its largest value
// (the baseline variant rounds products and sums apart, without FMA, and the test's loss
// y cos(3y + 1) amplifies y's rounding; a wrong slice or tail is off by the entry's own size).
TEST(UnitGemm, CombinedTrainingPathMatchesReferenceWithGradients) {
  UnitGemmPin pin;
  torch::manual_seed(22);
  for (int threads : {1, 2})
    for (std::string act : {"gelu", "swiglu"})
      for (int64_t B : {1, 2})
        for (bool bias : {false, true}) {
          at::set_num_threads(threads);
          const int64_t E = 3, D = 19, F = 40, T = 30, P = 70;
          ExpertBank bank64(E, D, F, parse_activation(act), bias);
          bank64.to(torch::kFloat64);
          {
            torch::NoGradGuard g;
            for (auto& p : bank64.parameters()) p.normal_(0, 0.5);
          }
          ExpertBank bank(E, D, F, parse_activation(act), bias);
          {
            torch::NoGradGuard g;
            for (size_t i = 0; i < bank.parameters().size(); ++i) bank.parameters()[i].copy_(bank64.parameters()[i]);
          }
          const auto unit_P = std::get<0>(torch::randint(E * B - 1, {P}, torch::kLong).sort());  // last unit empty
          const auto token_P = torch::randint(T, {P}, torch::kLong);
          const auto counts = torch::bincount(unit_P, {}, E * B);
          const auto x = torch::randn({T, D}, torch::kFloat64);
          const auto w0 = torch::rand({P}, torch::kFloat64) + 0.1;
          auto run = [&](ExpertBank& b, int64_t rows) {  // rows 0: the reference
            const auto dtype = rows == 0 ? torch::kFloat64 : torch::kFloat;
            auto weight_P = w0.to(dtype).clone().requires_grad_(true);
            for (auto& p : b.parameters()) p.mutable_grad() = at::Tensor();
            ExpertBlocks blocks(b, B);
            auto got = test::output_and_grads(
                [&](const at::Tensor& x) {
                  if (rows == 0)
                    return dense_reference(x, Assignment{token_P, unit_P, weight_P, T, E * B},
                                           B == 1 ? static_cast<UnitBank&>(b) : blocks);
                  return grouped_ffn_combined(x, token_P, weight_P, counts, b.gate_up_proj, b.down_proj,
                                              act == "swiglu", b.gate_up_proj_bias,
                                              B == 1 ? b.down_proj_bias : at::Tensor(), B, rows * (F / B));
                },
                x.to(dtype),
                [&] {
                  return std::vector<at::Tensor>{weight_P.grad(), b.gate_up_proj.grad(), b.down_proj.grad(),
                                                 grad_of(b.gate_up_proj_bias), grad_of(b.down_proj_bias)};
                });
            for (auto& t : got)
              if (t.defined()) t = t.to(torch::kFloat64);
            return got;
          };
          const auto ref = run(bank64, 0);
          for (size_t i = 0; i < ref.size(); ++i) {
            if (ref[i].defined()) {
              EXPECT_GT(ref[i].abs().max().item<double>(), 1e-3) << "entry " << i;
            }
          }
          const std::vector<std::string> names{
              "output", "grad x", "grad weight_P", "grad gate_up", "grad down", "grad gate_up bias", "grad down bias"};
          force_unit_gemm(false);
          const auto blas = run(bank, P);  // LibTorch's products in float32: the rounding to expect
          force_unit_gemm(true);
          for (int64_t rows : {int64_t{1}, int64_t{3}, P}) {
            const auto got = run(bank, rows);
            for (size_t i = 0; i < ref.size(); ++i) {
              ASSERT_EQ(got[i].defined(), ref[i].defined()) << names[i];
              if (!ref[i].defined()) continue;
              const double err = (got[i] - ref[i]).abs().max().item<double>(), top = ref[i].abs().max().item<double>();
              const double blas_err = (blas[i] - ref[i]).abs().max().item<double>();
              EXPECT_LT(err, std::max(4 * blas_err, 1e-4 * top))
                  << fmt::format("{} B={} bias {} chunk rows {} threads {} ({}): {} max diff {} of {} (LibTorch's {})",
                                 act, B, bias, rows, threads, level_name(), names[i], err, top, blas_err);
            }
          }
          at::set_num_threads(1);
        }
}
