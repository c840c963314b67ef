// Expert parallelism's memory sharding on the trainer's side, as rank 0 of 2 with the partner
// rank simulated in process: the gradient norm over split gradients, checkpoint tensors gathered
// whole onto their writers, AdamW moments cut to a slice.
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/torch.h>

#include <deque>

#include "io/checkpoint.h"
#include "train/across_ranks.h"
#include "train/optim.h"
#include "train/parallel.h"

using namespace mf;

namespace {

// Rank 0 of 2. sum() adds the partner's values; all_to_all delivers the partner's next queued
// rows (as many as out_rows[1]) after this rank's own.
class PartnerGroup : public DataParallel {
 public:
  int rank() const override { return 0; }
  int world() const override { return 2; }
  void sum(std::vector<at::Tensor>& t) override {
    for (auto& x : t) x.add_(partner_sums.front()), partner_sums.pop_front();
  }
  void start_sum(std::vector<at::Tensor>) override {}
  void finish_sums() override {}
  void broadcast(std::vector<at::Tensor>&) override {}
  void barrier() override {}
  void all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_rows,
                  std::vector<int64_t> in_rows) override {
    ASSERT_EQ(out_rows[0], in_rows[0]);  // what this rank sends itself
    out.narrow(0, 0, out_rows[0]).copy_(in.narrow(0, 0, in_rows[0]));
    auto from_partner = partner_rows.front().reshape({-1, out.size(1)});
    partner_rows.pop_front();
    ASSERT_EQ(from_partner.size(0), out_rows[1]);
    out.narrow(0, out_rows[0], out_rows[1]).copy_(from_partner);
    sent_to_partner += in_rows[1];
  }
  double take_comm_seconds() override { return 0; }

  std::deque<at::Tensor> partner_sums, partner_rows;
  int64_t sent_to_partner = 0;
};

at::Tensor with_grad(at::Tensor value, at::Tensor grad) {
  value.requires_grad_(true);
  value.mutable_grad() = grad;
  return value;
}

}  // namespace

TEST(ShardedParams, WithoutKeepsTheOthersInOrder) {
  auto a = torch::zeros({2}), b = torch::zeros({2}), c = torch::zeros({2});
  auto rest = without({a, b, c}, {b});
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_TRUE(rest[0].is_same(a));
  EXPECT_TRUE(rest[1].is_same(c));
}

TEST(ShardedParams, GradientNormByHand) {
  // replicated gradient (3, 0); this rank's slice 4, the partner's 12: norm sqrt(9 + 16 + 144) = 13
  PartnerGroup g;
  g.partner_sums.push_back(torch::tensor({144.0}, torch::kDouble));
  auto r = with_grad(torch::zeros({2}, torch::kDouble), torch::tensor({3.0, 0.0}, torch::kDouble));
  auto s = with_grad(torch::zeros({1, 1}, torch::kDouble), torch::full({1, 1}, 4.0, torch::kDouble));
  EXPECT_NEAR(clip_grad_norm(g, {r}, {s}, 6.5), 13.0, 1e-12);
  EXPECT_NEAR(r.grad()[0].item<double>(), 3.0 * 6.5 / (13.0 + 1e-6), 1e-12);  // scaled by max / (norm + 1e-6)
  EXPECT_NEAR(s.grad()[0][0].item<double>(), 4.0 * 6.5 / (13.0 + 1e-6), 1e-12);
}

TEST(ShardedParams, GradientNormEqualsOneProcessClip) {
  torch::manual_seed(3);
  auto whole_grad = torch::randn({4, 3}, torch::kDouble), rep_grad = torch::randn({5}, torch::kDouble);
  for (double max_norm : {0.5, 100.0}) {
    PartnerGroup g;
    g.partner_sums.push_back(whole_grad.narrow(0, 2, 2).square().sum().reshape({1}));
    auto r = with_grad(torch::zeros({5}, torch::kDouble), rep_grad.clone());
    auto s = with_grad(torch::zeros({2, 3}, torch::kDouble), whole_grad.narrow(0, 0, 2).clone());
    auto r_ref = with_grad(torch::zeros({5}, torch::kDouble), rep_grad.clone());
    auto s_ref = with_grad(torch::zeros({4, 3}, torch::kDouble), whole_grad.clone());
    const double ref = torch::nn::utils::clip_grad_norm_(std::vector<at::Tensor>{r_ref, s_ref}, max_norm);
    EXPECT_NEAR(clip_grad_norm(g, {r}, {s}, max_norm), ref, 1e-12);
    EXPECT_TRUE(torch::allclose(r.grad(), r_ref.grad(), 1e-12, 1e-12)) << max_norm;
    EXPECT_TRUE(torch::allclose(s.grad(), s_ref.grad().narrow(0, 0, 2), 1e-12, 1e-12)) << max_norm;
  }
}

TEST(ShardedParams, CheckpointTensorsAreGatheredWholeOntoTheirWriter) {
  torch::manual_seed(4);
  const auto big = torch::randn({6, 4}), small = torch::randn({2, 2}), rep = torch::randn({3});
  for (bool to_rank0 : {true, false}) {
    PartnerGroup g;
    NamedTensors tensors = {{"rep", rep}, {"big", big.narrow(0, 0, 3)}, {"small", small.narrow(0, 0, 1)}};
    // the writers planned over the whole shapes: "big" (96 bytes) to rank 0, "small" (16) to rank 1
    const auto plan = shard_plan({{"rep", rep}, {"big", big}, {"small", small}}, 2);
    ASSERT_EQ(plan[1], 0);
    ASSERT_EQ(plan[2], 1);
    g.partner_rows = {big.narrow(0, 3, 3)};
    g.partner_rows.push_back(to_rank0 ? small.narrow(0, 1, 1) : torch::empty({0}));
    gather_for_writing(g, tensors, {"big", "small"}, to_rank0);
    EXPECT_TRUE(tensors[0].second.is_same(rep));
    EXPECT_TRUE(torch::equal(tensors[1].second, big));
    if (to_rank0) {
      EXPECT_TRUE(torch::equal(tensors[2].second, small));
      EXPECT_EQ(g.sent_to_partner, 0);
    } else {  // rank 1 stores it: here a placeholder of the whole shape, and this rank's slice went there
      EXPECT_TRUE(tensors[2].second.is_meta());
      EXPECT_EQ(tensors[2].second.sizes(), small.sizes());
      EXPECT_EQ(g.sent_to_partner, 1);
    }
    EXPECT_TRUE(g.partner_rows.empty());
  }
}

TEST(ShardedParams, OptimizerMomentsAreCutToTheSlice) {
  torch::nn::Linear lin(3, 4);  // weight [4, 3]
  TrainConfig c;
  auto opt = make_optimizer(*lin, c);
  lin->weight.mutable_grad() = torch::arange(12, torch::kFloat).view({4, 3});
  lin->bias.mutable_grad() = torch::ones({4});
  opt->step();
  const auto before = optimizer_state_tensors(*opt, *lin);
  at::Tensor m_whole;
  for (auto& [name, t] : before)
    if (name == "weight.exp_avg") m_whole = t.clone();
  ASSERT_TRUE(m_whole.defined());
  {
    torch::NoGradGuard no_grad;
    lin->weight.set_data(lin->weight.narrow(0, 2, 2).clone());  // rank 1 of 2 keeps rows 2..3
  }
  narrow_optimizer_state(*opt, {lin->weight}, 1);
  for (auto& [name, t] : optimizer_state_tensors(*opt, *lin)) {
    if (name == "weight.exp_avg") {
      EXPECT_TRUE(torch::equal(t, m_whole.narrow(0, 2, 2)));
    } else if (name == "weight.exp_avg_sq") {
      EXPECT_EQ(t.size(0), 2);
    } else if (name == "bias.exp_avg") {
      EXPECT_EQ(t.size(0), 4);  // not sharded: untouched
    }
  }
}
