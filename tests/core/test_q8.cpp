// int8 weights (core/q8.h): blocks quantised by hand; the row kernel and every path that reads
// such a weight (project, its panels above kBf16KernelRows, embed_rows, weight_row, widened)
// against float64 math on the dequantised weights, at shapes that reach the chunk path, its tail
// and partial tiles, on views of a larger weight (an expert, rows from the middle, 32-aligned
// columns), on the SIMD level this run has (ctest also runs Q8.* capped at MOEFORGE_SIMD=base and
// avx2) and on one and two threads.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/bf16.h"
#include "core/q8.h"
#include "core/row_errors.h"
#include "core/row_kernel.h"

using namespace mf;
using test::rel_error;
using test::sum_error;

namespace {

at::Tensor quantised(const at::Tensor& w) {
  auto q = q8_empty(w.sizes(), w.options());
  q8_quantize(q, w);
  return q;
}

// number i of w (a float tensor) dequantised by the definition: round(w / s) s, s = max |block| / 127
at::Tensor by_definition(const at::Tensor& w) {
  const auto b = w.to(at::kDouble).reshape({-1, kQ8Block});
  const auto s = b.abs().amax(1, true) / 127.0;
  return (at::round(b / at::where(s > 0, s, at::ones_like(s))) * s.to(at::kFloat).to(at::kDouble)).view(w.sizes());
}

}  // namespace

TEST(Q8, BlocksByHand) {
  // block 0: max |w| = 2.54, s = 0.02: 1.0 -> 50, -2.54 -> -127, 0.011 -> 1 (0.55 rounds up), 0.009 -> 0;
  // block 1: all zero: scale 0, values 0
  auto w = torch::zeros({2, 32});
  w[0][0] = 1.0, w[0][1] = -2.54, w[0][2] = 0.011, w[0][3] = 0.009;
  const auto q = quantised(w);
  ASSERT_EQ(q.scalar_type(), at::kChar);
  const auto rows = q8_of(q);
  EXPECT_FLOAT_EQ(rows.scale[0], 2.54f / 127);
  EXPECT_EQ(rows.scale[1], 0.0f);
  EXPECT_EQ(rows.q[0], 50);
  EXPECT_EQ(rows.q[1], -127);
  EXPECT_EQ(rows.q[2], 1);
  EXPECT_EQ(rows.q[3], 0);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(rows.q[i], 0);
  const auto back = widened(q, at::kFloat);
  EXPECT_FLOAT_EQ(back[0][0].item<float>(), 50 * (2.54f / 127));
  EXPECT_FLOAT_EQ(back[0][1].item<float>(), -2.54f);
  EXPECT_TRUE(back[1].eq(0).all().item<bool>());
  // x = (1, 2, 3, 4, 0, ...) times row 0: 50 s - 254 s + 3 s
  float y = 0;
  const float x[32] = {1, 2, 3, 4};
  q8_rows(x, 32, 1, 32, rows, 32, 1, &y, 1);
  EXPECT_FLOAT_EQ(y, (50 - 254 + 3) * (2.54f / 127));
}

TEST(Q8, DequantisedWeightsAreTheDefinition) {
  torch::manual_seed(2);
  const auto w = torch::randn({5, 96}) * torch::rand({5, 96}).pow(3);  // blocks of different ranges
  EXPECT_TRUE(widened(quantised(w), at::kFloat).to(at::kDouble).allclose(by_definition(w), 1e-7, 1e-30));
  // within half a step of the float32 weights
  const auto step = w.view({-1, kQ8Block}).abs().amax(1, true) / 127;
  EXPECT_TRUE(
      ((widened(quantised(w), at::kFloat) - w).view({-1, kQ8Block}).abs() <= step / 2 + 1e-7).all().item<bool>());
}

TEST(Q8, RowsEqualFloat64MathOnTheDequantisedWeights) {
  torch::manual_seed(3);
  for (int threads : {1, 2}) {
    at::set_num_threads(threads);
    // M: one row, whole and partial tiles, the largest the row kernel takes, the panel path above it;
    // K: 32 (only the tail at AVX-512), 64 (one chunk there), 96 and 288 (chunks and a tail), 320;
    // N: whole and partial tiles of 4 weight rows
    for (int64_t M : {1, 2, 3, 5, 8, 128, 129})
      for (int64_t K : {32, 64, 96, 288, 320})
        for (int64_t N : {1, 3, 4, 9, 130}) {
          const auto what = fmt::format("M={} K={} N={} threads={}", M, K, N, threads);
          const auto x = torch::randn({M, K});
          const auto w = torch::randn({N, K});
          const auto q = quantised(w);
          const auto w64 = widened(q, at::kFloat).to(at::kDouble);
          const double bound = static_cast<double>(K + 1) * std::ldexp(1.0, -24);
          EXPECT_LT(sum_error(project(x, q), x, w64), bound) << what;
          const auto b = torch::randn({N});
          EXPECT_LT(rel_error(project(x, q, b), project(x, q) + b), 1e-6) << what;
          // one thread's share writes its columns only
          auto part = torch::full({M, N}, 7.0f);
          const int64_t n0 = N / 3, n1 = N - N / 4;
          rows_part(x.data_ptr<float>(), K, M, K, q8_of(q), K, n0, n1, part.data_ptr<float>(), N);
          if (n1 > n0) {
            EXPECT_LT(sum_error(part.narrow(1, n0, n1 - n0), x, w64.narrow(0, n0, n1 - n0)), bound) << what;
          }
          EXPECT_TRUE(part.narrow(1, 0, n0).eq(7).all().item<bool>()) << what << ": wrote outside its share";
          EXPECT_TRUE(part.narrow(1, n1, N - n1).eq(7).all().item<bool>()) << what << ": wrote outside its share";
        }
  }
}

TEST(Q8, ViewsOfALargerWeightFindTheirScales) {
  torch::manual_seed(4);
  const auto w = torch::randn({3, 40, 96});  // [E, N, K]: an expert bank
  const auto q = quantised(w);
  const auto w64 = widened(q, at::kFloat).to(at::kDouble);
  const auto x = torch::randn({5, 96});
  const double bound = 97 * std::ldexp(1.0, -24);
  EXPECT_LT(sum_error(project(x, q.select(0, 2)), x, w64[2]), bound) << "an expert";
  EXPECT_LT(sum_error(project(x, q[1].narrow(0, 8, 20)), x, w64[1].narrow(0, 8, 20)), bound) << "rows";
  const auto cols = q[1].narrow(1, 32, 64);  // rows 96 apart, 64 numbers from column 32
  EXPECT_LT(sum_error(project(x.narrow(1, 0, 64), cols), x.narrow(1, 0, 64), w64[1].narrow(1, 32, 64)), bound)
      << "columns";
  // rows of an embedding table, one by one and gathered
  const auto table = q[0];
  std::vector<float> row(96);
  weight_row(table, 17, row.data());
  EXPECT_TRUE(torch::from_blob(row.data(), {96}).to(at::kDouble).equal(w64[0][17]));
  const auto ids = torch::tensor({{3, 17}, {39, 0}}, torch::kLong);
  EXPECT_TRUE(embed_rows(ids, table).to(at::kDouble).equal(w64[0].index_select(0, ids.view(-1)).view({2, 2, 96})));
  // a copy has no scales, a column view off the blocks none it can find: errors that say so
  EXPECT_THROW(q8_of(q[0].clone()), c10::Error);
  EXPECT_THROW(q8_of(q[0].narrow(1, 16, 32)), c10::Error);
}

// One or two x rows against a share of at least 512 KB of weights take tiles of rows 1/8 of the
// share apart (row_kernel.cpp's strided tiles), smaller shares tiles of neighbouring rows: the same
// sums bit for bit (a share cut into 32-row pieces against it whole), float64 math within K u, for
// float32, bf16 and int8 weights, N not a multiple of 8, rows ld apart
TEST(RowKernel, LargeSharesTakeStridedTilesWithTheSameSums) {
  torch::manual_seed(11);
  const int64_t K = 1024, ld = K + 32, N = 1029;  // a share of 1 M numbers
  const auto w = torch::randn({N, ld}), q = quantised(w), half = w.to(at::kBFloat16);
  const auto w64 = widened(q, at::kFloat).narrow(1, 0, K);
  for (int64_t M : {1, 2, 3}) {
    const auto x = torch::randn({M, K});
    auto whole = [&](const auto& weights, at::Tensor y) {  // all N rows as one share
      rows_part(x.data_ptr<float>(), K, M, K, weights, ld, 0, N, y.data_ptr<float>(), N);
      return y;
    };
    auto pieces = [&](const auto& weights, at::Tensor y) {  // 32 rows at a time: 32 K numbers, neighbouring rows
      for (int64_t n = 0; n < N; n += 32)
        rows_part(x.data_ptr<float>(), K, M, K, weights, ld, n, std::min(N, n + 32), y.data_ptr<float>(), N);
      return y;
    };
    const auto* f32 = w.data_ptr<float>();
    const auto* bf16 = reinterpret_cast<const uint16_t*>(half.data_ptr<at::BFloat16>());
    const double bound = static_cast<double>(K + 1) * std::ldexp(1.0, -24);
    const auto y32 = whole(f32, torch::zeros({M, N})), y16 = whole(bf16, torch::zeros({M, N}));
    const auto y8 = whole(q8_of(q), torch::zeros({M, N}));
    EXPECT_TRUE(y32.equal(pieces(f32, torch::zeros({M, N})))) << "float32, M " << M;
    EXPECT_TRUE(y16.equal(pieces(bf16, torch::zeros({M, N})))) << "bf16, M " << M;
    EXPECT_TRUE(y8.equal(pieces(q8_of(q), torch::zeros({M, N})))) << "int8, M " << M;
    EXPECT_LT(sum_error(y32, x, w.narrow(1, 0, K)), bound) << "float32, M " << M;
    EXPECT_LT(sum_error(y16, x, half.narrow(1, 0, K)), bound) << "bf16, M " << M;
    EXPECT_LT(sum_error(y8, x, w64), bound) << "int8, M " << M;
  }
}
