// The bf16-weight kernel (core/bf16.h): by hand, and against float64 math on the same rounded
// weights at shapes that reach every tile and tail, on the SIMD level this run has (ctest also
// runs these capped at MOEFORGE_SIMD=base and avx2) and on one and two threads.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>

#include "core/bf16.h"
#include "core/row_errors.h"
#include "core/row_kernel.h"

using namespace mf;

using test::rel_error;
using test::sum_error;

TEST(Bf16, RowsByHand) {
  // bf16 bit patterns: 0x3F80 = 1, 0xC000 = -2, 0x3F00 = 0.5, 0x4040 = 3, 0x3FC0 = 1.5 (the top halves of float32's)
  const uint16_t w[2][5] = {{0x3F80, 0xC000, 0x3F00, 0x4040, 0x3FC0}, {0x4040, 0x3F80, 0x3F80, 0x3F80, 0x3F80}};
  const float x[5] = {1, 2, 3, 4, 2};
  float y[2] = {0, 0};
  bf16_rows(x, 5, 1, 5, &w[0][0], 5, 2, y, 2);
  EXPECT_FLOAT_EQ(y[0], 1 - 4 + 1.5f + 12 + 3);  // 13.5
  EXPECT_FLOAT_EQ(y[1], 3 + 2 + 3 + 4 + 2);      // 14
  // the same through project(), weights given as a bf16 tensor
  auto w_NK = torch::tensor({1.0, -2.0, 0.5, 3.0, 1.5, 3.0, 1.0, 1.0, 1.0, 1.0}).view({2, 5}).to(at::kBFloat16);
  auto y_N = project(torch::tensor({1.0f, 2.0f, 3.0f, 4.0f, 2.0f}), w_NK, torch::tensor({0.5f, -1.0f}));
  EXPECT_FLOAT_EQ(y_N[0].item<float>(), 14.0f);
  EXPECT_FLOAT_EQ(y_N[1].item<float>(), 13.0f);
}

TEST(Bf16, ProjectEqualsFloat64MathOnTheRoundedWeights) {
  torch::manual_seed(3);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    // M: one row, whole and partial row tiles, the largest the row kernel takes, the panel path above it;
    // K: below, at and between vector widths (the scalar tail), 61 = whole chunks of words, a vector and a
    // tail on AVX2 (48 + 8 + 5) and baseline (56 + 4 + 1); N: whole and partial tiles of 4 weight rows
    // (of 8 when M = 1: 14 = 8 + 4 + 2)
    for (int64_t M : {1, 2, 3, 5, 8, 40, 128, 129})
      for (int64_t K : {1, 7, 16, 37, 61, 100})
        for (int64_t N : {1, 3, 4, 9, 14, 130}) {
          const auto what = fmt::format("M={} K={} N={} threads={}", M, K, N, threads);
          auto x = torch::randn({M, K});
          auto w = torch::randn({N, K}).to(at::kBFloat16);
          auto b = torch::randn({N});
          const double bound = static_cast<double>(K + 1) * std::ldexp(1.0, -24);
          const auto y = project(x, w);
          EXPECT_LT(sum_error(y, x, w), bound) << what;
          EXPECT_TRUE(project(x, w, b).equal(y + b)) << what << ", bias";
          // a weight whose rows are a slice of a wider matrix (an expert block's columns), into an output slice
          auto wide = torch::randn({N, K + 5}).to(at::kBFloat16);
          auto out = torch::full({M, N + 3}, 7.0f);
          auto dst = out.narrow(1, 2, N);
          project_into(dst, x, wide.narrow(1, 3, K));
          EXPECT_LT(sum_error(dst, x, wide.narrow(1, 3, K)), bound) << what << ", strided";
          EXPECT_TRUE(out.narrow(1, 0, 2).eq(7).all().item<bool>()) << what << ": wrote outside its slice";
        }
  }
  at::set_num_threads(1);
}

TEST(Bf16, TheSameKernelOnFloat32WeightsAndOneThreadsShare) {
  const float w[2][5] = {{1, -2, 0.5f, 3, 1.5f}, {3, 1, 1, 1, 1}}, x[5] = {1, 2, 3, 4, 2};
  float y[2] = {0, 0};
  f32_rows(x, 5, 1, 5, &w[0][0], 5, 2, y, 2);
  EXPECT_FLOAT_EQ(y[0], 13.5f);
  EXPECT_FLOAT_EQ(y[1], 14.0f);
  torch::manual_seed(5);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    for (int64_t M : {1, 3, 4, 9})
      for (int64_t K : {1, 7, 16, 37, 100})
        for (int64_t N : {1, 4, 9, 14, 130}) {
          const auto what = fmt::format("M={} K={} N={} threads={}", M, K, N, threads);
          auto x = torch::randn({M, K}), w = torch::randn({N, K + 3});  // rows K + 3 apart
          auto y = torch::full({M, N}, 7.0f);
          f32_rows(x.data_ptr<float>(), K, M, K, w.data_ptr<float>(), K + 3, N, y.data_ptr<float>(), N);
          const double bound = static_cast<double>(K + 1) * std::ldexp(1.0, -24);
          EXPECT_LT(sum_error(y, x, w.narrow(1, 0, K)), bound) << what;
          // a share: outputs [n0, n1) written, the rest untouched, bf16 and float32 weights alike
          const int64_t n0 = N / 3, n1 = N - N / 4;
          auto part = torch::full({M, N}, 7.0f), half = w.to(at::kBFloat16);
          rows_part(x.data_ptr<float>(), K, M, K, w.data_ptr<float>(), K + 3, n0, n1, part.data_ptr<float>(), N);
          EXPECT_TRUE(part.narrow(1, n0, n1 - n0).equal(y.narrow(1, n0, n1 - n0))) << what << ", share";
          EXPECT_TRUE(part.narrow(1, 0, n0).eq(7).all().item<bool>()) << what << ": wrote outside its share";
          EXPECT_TRUE(part.narrow(1, n1, N - n1).eq(7).all().item<bool>()) << what << ": wrote outside its share";
          rows_part(x.data_ptr<float>(), K, M, K, reinterpret_cast<const uint16_t*>(half.data_ptr<at::BFloat16>()),
                    K + 3, n0, n1, part.data_ptr<float>(), N);
          if (n1 > n0) {
            EXPECT_LT(sum_error(part.narrow(1, n0, n1 - n0), x, half.narrow(1, 0, K).narrow(0, n0, n1 - n0)), bound)
                << what;
          }
        }
  }
  at::set_num_threads(1);
}

TEST(Bf16, OtherDtypesAndAutogradWidenTheWeight) {
  torch::manual_seed(4);
  auto w = torch::randn({6, 10}).to(at::kBFloat16);
  auto x64 = torch::randn({3, 10}, torch::kFloat64);
  EXPECT_LT(rel_error(project(x64, w), at::mm(x64, w.to(at::kDouble).t())), 1e-14);
  auto x = torch::randn({2, 4, 10}, torch::requires_grad());
  auto y = project(x, w);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 4, 6}));
  y.sum().backward();  // through the widened weight
  EXPECT_LT(rel_error(x.grad(), w.to(at::kFloat).sum(0).expand({2, 4, 10})), 1e-6);
  // float32 weights: LibTorch's linear, unchanged
  auto w32 = torch::randn({6, 10});
  EXPECT_TRUE(project(x.detach(), w32).equal(at::linear(x.detach(), w32)));
}

TEST(Bf16, EmbedRowsWidensTheRows) {
  auto table = torch::randn({11, 5}).to(at::kBFloat16);
  auto ids = torch::tensor({{3, 0}, {10, 3}}, torch::kLong);
  auto rows = embed_rows(ids, table);
  EXPECT_EQ(rows.scalar_type(), at::kFloat);
  EXPECT_TRUE(rows.equal(table.to(at::kFloat).index_select(0, ids.flatten()).view({2, 2, 5})));
}

TEST(Bf16, CopyWeightsRoundsAsLibTorchDoesAndWidensBack) {
  auto x = torch::randn({37, 53}) * 100;
  // ties (exactly halfway between two bf16 numbers, even and odd below), infinities, NaN, denormals, -0
  const std::vector<uint32_t> special = {0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                                         0x7F800001, 0x00000001, 0x80000000, 0x7F7FFFFF, 0x00808000};
  auto flat = x.view({-1});
  for (size_t i = 0; i < special.size(); ++i) {
    float f;
    std::memcpy(&f, &special[i], sizeof f);
    flat[static_cast<int64_t>(i * 97)] = f;
  }
  auto held = torch::empty({37, 53}, torch::kBFloat16);
  copy_weights(held, x);
  const auto want = x.to(at::kBFloat16);
  // bit for bit (NaN: a NaN)
  const auto a = held.view(at::kShort), b = want.view(at::kShort);
  EXPECT_TRUE((a == b).logical_or(held.isnan().logical_and(want.isnan())).all().item<bool>());
  EXPECT_TRUE(widened(held, at::kFloat).equal(held.to(at::kFloat)) ||
              widened(held, at::kFloat).isnan().any().item<bool>());
  auto finite = held.masked_fill(held.isnan(), 0);
  EXPECT_TRUE(widened(finite, at::kFloat).equal(finite.to(at::kFloat)));
}
