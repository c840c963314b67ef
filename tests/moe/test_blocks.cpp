// (expert, block) units: ExpertBlocks and the grouped FFN over block slices against the
// per-unit reference (float64, outputs and gradients).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>

#include "core/simd.h"
#include "core/unit_gemm.h"
#include "moe/banks.h"
#include "moe/combined_ffn.h"
#include "moe/dispatch.h"
#include "moe/fast_vs_reference.h"
#include "moe/fused_units.h"
#include "moe/grouped_ffn.h"
#include "moe/unit_slices.h"

using namespace mf;

namespace {

ExpertBank random_bank(int64_t E, int64_t D, int64_t F, const std::string& activation, bool bias) {
  ExpertBank bank(E, D, F, parse_activation(activation), bias);
  bank.to(torch::kFloat64);
  torch::NoGradGuard g;
  for (auto& p : bank.parameters()) p.normal_(0, 0.5);
  return bank;
}

// An ExpertBank's units without its combined path, as expert parallelism's bank
class GroupedOnlyBank : public UnitBank {
 public:
  explicit GroupedOnlyBank(ExpertBank& bank) : bank_(bank) {}
  int64_t num_units() const override { return bank_.num_units(); }
  at::Tensor forward_grouped(const at::Tensor& rows_PD, const at::Tensor& counts_E) override {
    return bank_.forward_grouped(rows_PD, counts_E);
  }
  at::Tensor forward_unit(int64_t unit, const at::Tensor& rows) override { return bank_.forward_unit(unit, rows); }

 private:
  ExpertBank& bank_;
};

// A random bank of E = 4 experts (D 5, F 6, biases) as B blocks each (B = 1: the experts
// themselves), and P = 40 pairs over T = 9 tokens sorted by unit, the last unit left empty
struct BlockPairs {
  static constexpr int64_t E = 4, D = 5, F = 6, T = 9, P = 40;
  int64_t B;
  ExpertBank bank;
  ExpertBlocks blocks{bank, B};
  at::Tensor unit_P, token_P, counts;
  BlockPairs(const std::string& act, int64_t B)
      : B(B),
        bank(random_bank(E, D, F, act, /*bias=*/true)),
        unit_P(std::get<0>(torch::randint(E * B - 1, {P}, torch::kLong).sort())),
        token_P(torch::randint(T, {P}, torch::kLong)),
        counts(torch::bincount(unit_P, {}, E * B)) {}
  UnitBank& units() { return B == 1 ? static_cast<UnitBank&>(bank) : blocks; }
  at::Tensor output_bias() const { return B == 1 ? bank.down_proj_bias : at::Tensor(); }
  int64_t M() const { return F / B; }
};

struct ThreadsForTest {  // the test binary runs one thread; these tests also take the threaded paths
  explicit ThreadsForTest(int n) { at::set_num_threads(n); }
  ~ThreadsForTest() { at::set_num_threads(1); }
};

}  // namespace

TEST(ExpertBlocks, SplitUnitsBalancesPairsAndKeepsUnitOrder) {
  // fewer than two non-empty units per thread: one list, empty units left out
  EXPECT_EQ(split_units({3, 0, 5}, 2), (std::vector<std::vector<size_t>>{{0, 2}}));
  EXPECT_EQ(split_units({3, 0, 5, 1, 2}, 1), (std::vector<std::vector<size_t>>{{0, 2, 3, 4}}));
  // largest first onto the least loaded: 9 -> t0, 5 -> t1, 4 -> t1 (9 | 9), 3 -> t0, 1 -> t1
  EXPECT_EQ(split_units({4, 9, 0, 3, 5, 1}, 2), (std::vector<std::vector<size_t>>{{1, 3}, {0, 4, 5}}));
}

TEST(ExpertBlocks, BlocksSumToTheExpertPlusItsOutputBias) {
  torch::manual_seed(7);
  for (std::string act : {"gelu", "swiglu"})
    for (bool bias : {false, true}) {
      auto bank = random_bank(3, 5, 12, act, bias);
      auto x = torch::randn({6, 5}, torch::kFloat64);
      for (int64_t B : {1, 2, 3, 4, 12})
        for (int64_t e = 0; e < 3; ++e) {
          auto sum = torch::zeros({6, 5}, torch::kFloat64);
          for (int64_t b = 0; b < B; ++b) sum = sum + bank.forward_block(e, b, B, x);
          if (bias) sum = sum + bank.down_proj_bias[e];
          EXPECT_TRUE(torch::allclose(sum, bank.forward_unit(e, x), 1e-12, 1e-12)) << act << " B=" << B;
        }
    }
}

// Random (token, (expert, block)) pairs, some units empty: grouped block units equal the
// per-unit reference in output and every gradient; with B = 1 they are the plain experts.
// With 2 threads and >= 4 non-empty units, threads take whole units (split_units).
TEST(ExpertBlocks, DispatchMatchesReferenceWithGradients) {
  torch::manual_seed(8);
  ThreadsForTest two(2);
  for (std::string act : {"gelu", "swiglu"})
    for (int64_t B : {1, 2, 3}) {
      const int64_t E = 4, D = 5, F = 6, T = 9, P = 20;
      auto bank = random_bank(E, D, F, act, /*bias=*/true);
      ExpertBlocks units(bank, B);
      Assignment a{torch::randint(T, {P}, torch::kLong), torch::randint(E * B - 1, {P}, torch::kLong),
                   torch::randn({P}, torch::kFloat64), T, E * B};  // the last unit stays empty
      const auto x = torch::arange(T * D, torch::kFloat64).view({T, D}).sin();
      auto run = [&](bool fast) {
        for (auto& p : bank.parameters()) p.mutable_grad() = at::Tensor();
        return test::output_and_grads(
            [&](const at::Tensor& x) { return fast ? dispatch(x, a, units).y_TD : dense_reference(x, a, units); }, x,
            [&] {
              return std::vector<at::Tensor>{bank.gate_up_proj.grad(), bank.down_proj.grad(),
                                             bank.gate_up_proj_bias.grad()};
            });
      };
      test::expect_close(run(true), run(false), {"output", "grad x", "grad gate_up", "grad down", "grad gate_up bias"},
                         act + " B=" + std::to_string(B));
      EXPECT_FALSE(bank.down_proj_bias.grad().defined() && bank.down_proj_bias.grad().abs().sum().item<double>() > 0)
          << "block units never add the output bias";
    }
}

TEST(ExpertBlocks, OutputBiasIsAddedOncePerExpertWeight) {
  auto bank = random_bank(3, 4, 6, "gelu", true);
  ExpertBlocks units(bank, 2);
  auto w_TE = torch::tensor({{0.5, 0.0, 0.25}, {0.0, 1.0, 0.0}}, torch::kFloat64);
  auto y = units.add_output_bias(torch::zeros({2, 4}, torch::kFloat64), w_TE);
  auto b = bank.down_proj_bias.detach();
  EXPECT_TRUE(torch::allclose(y[0], 0.5 * b[0] + 0.25 * b[2]));
  EXPECT_TRUE(torch::allclose(y[1], b[1]));
}

// The inference path (gather, unit FFN and combine per chunk) equals the per-unit reference,
// across chunk boundaries (chunks of 1, 3 and all rows), empty units, B = 1 with the output bias.
TEST(ExpertBlocks, CombinedInferencePathMatchesReference) {
  torch::manual_seed(9);
  for (int threads : {1, 2})
    for (std::string act : {"gelu", "swiglu"})
      for (int64_t B : {1, 2, 3}) {
        ThreadsForTest use(threads);
        BlockPairs c(act, B);
        Assignment a{c.token_P, c.unit_P, torch::randn({c.P}, torch::kFloat64), c.T, c.E * B};
        auto x = torch::randn({c.T, c.D}, torch::kFloat64);
        torch::NoGradGuard g;
        auto ref = dense_reference(x, a, c.units());
        for (int64_t rows : {int64_t{1}, int64_t{3}, c.P}) {
          auto y = grouped_ffn_combined(x, a.token_P, a.weight_P, c.counts, c.bank.gate_up_proj, c.bank.down_proj,
                                        act == "swiglu", c.bank.gate_up_proj_bias, c.output_bias(), B, rows * c.M());
          EXPECT_TRUE(torch::allclose(y, ref, 1e-12, 1e-12))
              << act << " B=" << B << " chunk rows " << rows << " threads " << threads;
        }
        EXPECT_TRUE(torch::allclose(dispatch(x, a, c.units()).y_TD, ref, 1e-12, 1e-12)) << "dispatch without grad";
      }
}

// The training path: the same chunks, differentiable (the hand-written chunk backward of
// moe/combined_ffn.h) in x, the pair weights, the weights and both biases, against the per-unit
// reference under autograd; across chunk boundaries, with an empty unit, 1 and 2 threads.
TEST(ExpertBlocks, CombinedTrainingPathMatchesReferenceWithGradients) {
  torch::manual_seed(10);
  for (int threads : {1, 2})
    for (std::string act : {"gelu", "swiglu"})
      for (int64_t B : {1, 2, 3}) {
        ThreadsForTest use(threads);
        BlockPairs c(act, B);
        auto& bank = c.bank;
        auto weight_P = torch::randn({c.P}, torch::kFloat64).requires_grad_(true);
        const auto x = torch::randn({c.T, c.D}, torch::kFloat64);
        auto run = [&](int64_t rows) {  // 0: the reference
          weight_P.mutable_grad() = at::Tensor();
          for (auto& p : bank.parameters()) p.mutable_grad() = at::Tensor();
          return test::output_and_grads(
              [&](const at::Tensor& x) {
                if (rows == 0)
                  return dense_reference(x, Assignment{c.token_P, c.unit_P, weight_P, c.T, c.E * B}, c.units());
                return grouped_ffn_combined(x, c.token_P, weight_P, c.counts, bank.gate_up_proj, bank.down_proj,
                                            act == "swiglu", bank.gate_up_proj_bias, c.output_bias(), B, rows * c.M());
              },
              x,
              [&] {
                return std::vector<at::Tensor>{weight_P.grad(), bank.gate_up_proj.grad(), bank.down_proj.grad(),
                                               bank.gate_up_proj_bias.grad(), bank.down_proj_bias.grad()};
              });
        };
        const auto ref = run(0);
        for (size_t i = 0; i < 5; ++i) EXPECT_GT(ref[i].abs().max().item<double>(), 1e-3) << "entry " << i;
        for (int64_t rows : {int64_t{1}, int64_t{3}, c.P})
          test::expect_close(
              run(rows), ref,
              {"output", "grad x", "grad weight_P", "grad gate_up", "grad down", "grad gate_up bias", "grad down bias"},
              fmt::format("{} B={} chunk rows {} threads {}", act, B, rows, threads));
      }
}

TEST(ExpertBlocks, FusedPathRefusesGradModeAndSortedPairsSkipTheSort) {
  auto bank = random_bank(2, 3, 4, "gelu", false);
  auto x = torch::randn({3, 3}, torch::kFloat64);
  auto token = torch::tensor({2, 0, 1, 2}, torch::kLong), counts = torch::tensor({2, 2}, torch::kLong);
  auto weight = torch::ones({4}, torch::kFloat64);
  ExpertBank trained(2, 3, 4, Activation::GELU);  // float32 (packable), weights requiring grad
  EXPECT_THROW(grouped_ffn_combined(x.to(torch::kFloat), token, weight, counts, trained.gate_up_proj, trained.down_proj,
                                    false, {}, {}, 1, kCombinedChunkHidden, trained.unit_pack()),
               c10::Error);
  // pairs given unit-major (units 0, 0, 1, 1) with the flag give what the sorted path gives
  Assignment sorted{token, torch::tensor({0, 0, 1, 1}, torch::kLong), weight, 3, 2};
  sorted.sorted_by_unit = true;
  Assignment shuffled{torch::tensor({1, 2, 0, 2}, torch::kLong), torch::tensor({1, 0, 0, 1}, torch::kLong), weight, 3,
                      2};
  EXPECT_TRUE(torch::allclose(dispatch(x, sorted, bank).y_TD, dispatch(x, shuffled, bank).y_TD, 1e-12, 1e-12));
}

// The fused kernel (gather and combine inside the GEMMs, moe/fused_units.h) against the float64
// reference: widths that are not whole panels or vectors (D = 50: a 48-column panel, then a
// 16-column one of which 2 columns are real; M = 7 or 21 hidden channels, padded to 16 or 32,
// twice that for SwiGLU's gate and up: panels of 1, 2 and 3 + 1 vectors), units over a 128-row chunk (130 rows), an
// empty unit, B = 1 with the output bias, 1 and 2 threads. Then a weight changed in place must reach the kernel (the
// pack is keyed on the version counter).
TEST(ExpertBlocks, FusedKernelMatchesTheReference) {
  ASSERT_TRUE(fused_units_available(torch::zeros({1})));  // the variant of this run's SIMD level (ctest caps it too)
  torch::manual_seed(11);
  for (int threads : {1, 2})
    for (std::string act : {"gelu", "swiglu"})
      for (int64_t B : {1, 3})
        for (bool bias : {false, true}) {
          ThreadsForTest use(threads);
          const int64_t E = 3, D = 50, F = 21, T = 140, M = F / B, U = E * B;
          auto bank64 = random_bank(E, D, F, act, bias);
          ExpertBank bank(E, D, F, parse_activation(act), bias);
          {
            torch::NoGradGuard g;
            for (size_t i = 0; i < bank.parameters().size(); ++i) bank.parameters()[i].copy_(bank64.parameters()[i]);
          }
          // unit u gets 130 - 40 u pairs (tokens 0, 1, ...), the last unit none
          std::vector<int64_t> tokens, units;
          for (int64_t u = 0; u + 1 < U; ++u)
            for (int64_t t = 0; t < std::max<int64_t>(130 - 40 * u, 1); ++t) {
              tokens.push_back(t);
              units.push_back(u);
            }
          const auto P = static_cast<int64_t>(tokens.size());
          Assignment a{torch::tensor(tokens), torch::tensor(units), torch::rand({P}, torch::kFloat64), T, U};
          auto x64 = torch::randn({T, D}, torch::kFloat64);
          torch::NoGradGuard g;
          ExpertBlocks blocks64(bank64, B);
          auto ref = dense_reference(x64, a, B == 1 ? static_cast<UnitBank&>(bank64) : blocks64);
          const auto counts = torch::bincount(a.unit_P, {}, U);
          auto run = [&] {
            return grouped_ffn_combined(x64.to(torch::kFloat), a.token_P, a.weight_P, counts, bank.gate_up_proj,
                                        bank.down_proj, act == "swiglu", bank.gate_up_proj_bias,
                                        B == 1 ? bank.down_proj_bias : at::Tensor(), B, kCombinedChunkHidden,
                                        bank.unit_pack());
          };
          const auto what = act + " B=" + std::to_string(B) + " bias " + std::to_string(bias) + " threads " +
                            std::to_string(threads) + " M " + std::to_string(M);
          EXPECT_TRUE(torch::allclose(run().to(torch::kFloat64), ref, 1e-4, 1e-4)) << what;
          bank64.down_proj.mul_(-0.5);
          bank.down_proj.mul_(-0.5);
          ref = dense_reference(x64, a, B == 1 ? static_cast<UnitBank&>(bank64) : blocks64);
          EXPECT_TRUE(torch::allclose(run().to(torch::kFloat64), ref, 1e-4, 1e-4)) << what << " after a weight change";
          // pre-activations of +-100 and more: erf saturates, exp reaches its clamps (silu(-100) = 0);
          // outputs reach 1e5, so the float32 sums are judged against the output's scale
          x64.mul_(40);
          ref = dense_reference(x64, a, B == 1 ? static_cast<UnitBank&>(bank64) : blocks64);
          const double err = (run().to(torch::kFloat64) - ref).abs().max().item<double>();
          EXPECT_LT(err, 1e-5 * ref.abs().max().item<double>()) << what << " at large inputs";
        }
}

// dispatch makes one choice of units path (units_path) and every path it can take gives the
// dispatcher's result; a pinned path the grad mode or machine cannot take is an error.
TEST(UnitsPath, TheChoiceIsReportedAndEveryPathAgrees) {
  torch::manual_seed(4);
  const int64_t T = 30, D = 16, E = 4;
  ExpertBank bank(E, D, 24);
  auto x = torch::randn({T, D});
  auto unit_TK = std::get<1>(torch::rand({T, E}).topk(2, -1));
  Assignment a{torch::arange(T).repeat_interleave(2), unit_TK.reshape({-1}), torch::rand({2 * T}), T, E};
  const bool fused = fused_units_available(x);
  EXPECT_EQ(units_path(x, bank), UnitsPath::Combined);  // grad mode: training
  {
    force_units_path(UnitsPath::Fused);
    EXPECT_THROW(dispatch(x, a, bank), c10::Error) << "the fused path pinned under grad mode";
    force_units_path(std::nullopt);
  }
  torch::NoGradGuard g;
  EXPECT_EQ(units_path(x, bank), fused_units_preferred(x) ? UnitsPath::Fused : UnitsPath::Combined);
  // many rows a unit (kFusedRowsMax each): the combined path where it runs on unit_gemm tiles,
  // else the fused kernel wherever it is taken unasked (AVX-512 and AVX2; never on baseline)
  const auto taken = simd_level() == SimdLevel::Base ? UnitsPath::Combined : UnitsPath::Fused;
  for (bool tiles : {true, false}) {
    force_unit_gemm(tiles);
    EXPECT_EQ(units_path(x, bank, kFusedRowsMax * E), tiles ? UnitsPath::Combined : taken) << tiles;
    EXPECT_EQ(units_path(x, bank, kFusedRowsMax * E - 1), taken) << tiles;
    EXPECT_EQ(units_path(x, bank), taken) << tiles;
  }
  force_unit_gemm(std::nullopt);
  EXPECT_EQ(units_path(x.to(torch::kFloat64), bank), UnitsPath::Combined);  // the fused kernel is float32
  const auto ref = dense_reference(x, a, bank);
  for (auto path : {UnitsPath::Grouped, UnitsPath::Combined, UnitsPath::Fused}) {
    force_units_path(path);
    if (path == UnitsPath::Fused && !fused) {
      EXPECT_THROW(dispatch(x, a, bank), c10::Error) << "fused pinned on a machine without it";
      std::cout << "[ NOT RUN  ] the fused units path: needs float32 on the CPU\n";
      continue;
    }
    EXPECT_EQ(units_path(x, bank), path);
    const auto y = dispatch(x, a, bank).y_TD;
    EXPECT_LT((y - ref).abs().max().item<double>(), 1e-5 * ref.abs().max().item<double>()) << to_string(path);
  }
  force_units_path(UnitsPath::Combined);
  GroupedOnlyBank grouped_only(bank);
  EXPECT_THROW(dispatch(x, a, grouped_only), c10::Error) << "the combined path pinned for a bank without one";
  force_units_path(std::nullopt);
}
