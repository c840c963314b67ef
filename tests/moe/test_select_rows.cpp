// moe/select_rows.h: top_k_index against at::topk on rows without ties, by hand where at::topk
// leaves the order open (ties, NaN), and against a stable sort on long rows with ties and NaN;
// unit_order against LibTorch's stable sort, and by hand.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "moe/select_rows.h"

using namespace mf;

namespace {

// T rows of E distinct scores (a random permutation of 0..E-1, scaled), in dtype
at::Tensor distinct_rows(int64_t T, int64_t E, at::ScalarType dtype) {
  std::vector<at::Tensor> rows;
  for (int64_t t = 0; t < T; ++t) rows.push_back(torch::randperm(E, torch::kFloat64) * 0.37 - 3);
  return torch::stack(rows).to(dtype);
}

at::Tensor long_rows(std::vector<std::vector<int64_t>> v) {
  std::vector<at::Tensor> rows;
  for (auto& r : v) rows.push_back(torch::tensor(r, torch::kLong));
  return torch::stack(rows);
}

}  // namespace

TEST(SelectRows, TopKEqualsLibTorchWithoutTies) {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (auto [E, K] : {std::pair<int64_t, int64_t>{1, 1}, {8, 2}, {64, 8}, {128, 8}, {256, 32}, {9, 9}}) {
      auto s = distinct_rows(600, E, dtype);  // 600 rows: more than one thread's grain
      EXPECT_TRUE(top_k_index(s, K).equal(std::get<1>(s.topk(K, -1, true, true)))) << "E " << E << " K " << K;
    }
}

TEST(SelectRows, TopKHandCases) {
  const double nan = std::nan("");
  // ties keep column order; NaN ranks above every number; a strided view reads the same
  auto s = torch::tensor({1.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 5.0, 1.0, nan, 3.0, nan}, torch::kFloat64).view({3, 4});
  EXPECT_TRUE(top_k_index(s, 2).equal(long_rows({{1, 2}, {3, 0}, {1, 3}})));
  EXPECT_TRUE(top_k_index(s, 4).equal(long_rows({{1, 2, 0, 3}, {3, 0, 1, 2}, {1, 3, 2, 0}})));
  auto t = s.t().contiguous().t();
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(top_k_index(t.to(torch::kFloat32), 1).equal(long_rows({{1}, {3}, {1}})));
  EXPECT_THROW(top_k_index(s, 5), c10::Error);
}

// the reference order: columns sorted by score, descending, NaN first, ties in column order
at::Tensor stable_top_k(const at::Tensor& s, int64_t K) {
  auto out = at::empty({s.size(0), K}, torch::kLong);
  const auto d = s.to(torch::kFloat64).contiguous();
  for (int64_t t = 0; t < s.size(0); ++t) {
    const double* row = d.data_ptr<double>() + t * s.size(1);
    std::vector<int64_t> cols(s.size(1));
    std::iota(cols.begin(), cols.end(), 0);
    std::stable_sort(cols.begin(), cols.end(),
                     [&](int64_t a, int64_t b) { return std::isnan(row[a]) ? !std::isnan(row[b]) : row[a] > row[b]; });
    for (int64_t k = 0; k < K; ++k) out[t][k] = cols[k];
  }
  return out;
}

TEST(SelectRows, TopKOfLongRowsWithTiesAndNaN) {
  // long rows take the groups' floor unless they hold a NaN: few distinct scores make ties at
  // the floor and at the K-th place, and some rows get NaNs
  torch::manual_seed(5);
  for (auto dtype : {torch::kFloat64, torch::kFloat32})
    for (auto [E, K] : {std::pair<int64_t, int64_t>{16, 2}, {64, 8}, {128, 8}, {130, 8}, {256, 32}, {64, 9}}) {
      auto s = torch::randint(5, {300, E}, torch::kFloat64);
      s.masked_fill_(torch::rand({300, E}) < 0.002, std::nan(""));
      s = s.to(dtype);
      EXPECT_TRUE(top_k_index(s, K).equal(stable_top_k(s, K))) << "E " << E << " K " << K;
      auto spread = (s * 0.37 + torch::randn({300, E}, torch::kFloat64).to(dtype)).to(dtype);  // few ties
      EXPECT_TRUE(top_k_index(spread, K).equal(stable_top_k(spread, K))) << "E " << E << " K " << K;
    }
}

// K from 16 on: the K-th largest found bit by bit on integer keys (below 16, the lanes' floor).
// -0 and +0 are one score (ties in column order), negatives order below them by magnitude, a tie
// at the K-th place keeps the first columns, and every dtype's extremes keep their order; against
// the stable sort.
TEST(SelectRows, TopKWithoutBranchesOnSignedZerosNegativesAndTies) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> row = {-0.0, 0.0, -1.0, 2.0, -0.0, -2.5, 1e-30, -1e-30, 0.0, inf, -inf, 2.0,
                             -1.0, 0.5, -0.0, 7.0, 0.0,  -3.0, 1e30,  -1e30,  2.0, 0.5, -0.0, 0.0};
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    auto s = torch::tensor(row, torch::kFloat64).view({1, -1}).to(dtype);
    for (int64_t K : {16, 17, 20, 24}) EXPECT_TRUE(top_k_index(s, K).equal(stable_top_k(s, K))) << "K " << K;
  }
  // the first 16: inf, 1e30, 7, the three 2s, the two 0.5s, 1e-30, then seven of the nine zeros
  auto s = torch::tensor(row, torch::kFloat32).view({1, -1});
  EXPECT_TRUE(top_k_index(s, 16).equal(long_rows({{9, 18, 15, 3, 11, 20, 13, 21, 6, 0, 1, 4, 8, 14, 16, 22}})));
  // below K 16 with E a multiple of 16: the lanes' floor, the same rules
  auto wide = row;
  wide.insert(wide.end(), {0.0, -0.0, 2.0, -1e-30, 0.5, -inf, 0.0, -0.0});
  for (auto dtype : {torch::kFloat64, torch::kFloat32}) {
    auto w = torch::tensor(wide, torch::kFloat64).view({1, 32}).to(dtype);
    for (int64_t K : {1, 4, 8, 12, 15}) EXPECT_TRUE(top_k_index(w, K).equal(stable_top_k(w, K))) << "K " << K;
  }
  // ties at the K-th place before larger scores: the first six zeros, and the ten ones after them
  auto tied_first = torch::cat({torch::zeros({1, 10}), torch::ones({1, 10})}, 1);
  EXPECT_TRUE(
      top_k_index(tied_first, 16).equal(long_rows({{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 0, 1, 2, 3, 4, 5}})));
  auto lows = torch::full({1, 16}, -inf, torch::kFloat32);  // every score -inf: the first K columns
  EXPECT_TRUE(top_k_index(lows, 3).equal(long_rows({{0, 1, 2}})));
}

TEST(SelectRows, UnitOrderIsTheStableSort) {
  auto unit = torch::tensor({2, 0, 2, 1, 0}, torch::kLong);
  EXPECT_TRUE(unit_order(unit, 3).equal(torch::tensor({1, 4, 3, 0, 2}, torch::kLong)));
  EXPECT_TRUE(unit_order(unit, 5).equal(torch::tensor({1, 4, 3, 0, 2}, torch::kLong)));  // empty units
  EXPECT_EQ(unit_order(torch::empty({0}, torch::kLong), 4).numel(), 0);
  torch::manual_seed(4);
  for (int64_t U : {1, 7, 256}) {
    auto u = torch::randint(U, {5000}, torch::kLong);
    EXPECT_TRUE(unit_order(u, U).equal(std::get<1>(u.sort(true, 0, false)))) << "U " << U;
  }
  try {
    unit_order(unit, 2);
    FAIL() << "a unit out of range must be an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("pair 0 names unit 2 of 2"), std::string::npos) << e.what();
  }
}
