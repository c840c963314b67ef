// The gradient sum overlapped with the backward, against a twin rank simulated in one process.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "train/grad_overlap.h"

using namespace mf;

namespace {

// A second rank with the same gradients: every sum doubles. Records when each sum started.
class TwinGroup : public DataParallel {
 public:
  int rank() const override { return 0; }
  int world() const override { return 2; }
  void sum(std::vector<at::Tensor>& t) override {
    for (auto& x : t) x.mul_(2);
  }
  void start_sum(std::vector<at::Tensor> t) override {
    started.push_back(t[0].numel());
    if (in_backward) ++started_in_backward;
    pending.insert(pending.end(), t.begin(), t.end());
  }
  void finish_sums() override {
    for (auto& x : pending) x.mul_(2);
    pending.clear();
  }
  void broadcast(std::vector<at::Tensor>&) override {}
  void barrier() override {}
  void all_to_all(at::Tensor&, at::Tensor&, std::vector<int64_t>, std::vector<int64_t>) override {}
  double take_comm_seconds() override { return 0; }

  std::vector<int64_t> started;  // the sizes of the sums started, in order
  std::vector<at::Tensor> pending;
  bool in_backward = false;
  int started_in_backward = 0;
};

struct Params {
  at::Tensor a, b, c, d;  // c is used by the first micro-batch only, d never
  std::vector<at::Tensor> all() const { return {a, b, c, d}; }
};

Params make_params() {
  torch::manual_seed(5);
  return {torch::randn({4, 3}, torch::kFloat64).requires_grad_(),
          torch::randn({3, 2}, torch::kFloat64).requires_grad_(), torch::randn({2}, torch::kFloat64).requires_grad_(),
          torch::randn({5}, torch::kFloat64).requires_grad_()};
}

at::Tensor micro_batch_loss(const Params& p, int m) {
  auto x = torch::arange(8, torch::kFloat64).view({2, 4}).add(m);
  auto loss = torch::tanh(x.matmul(p.a)).matmul(p.b).pow(2).sum();
  return m == 0 ? loss + (p.c * p.c).sum() : loss;
}

}  // namespace

TEST(GradOverlap, SumsEqualTheSumAfterTheBackwardAndStartDuringIt) {
  auto ref = make_params();
  for (int m : {0, 1}) micro_batch_loss(ref, m).backward();

  for (int64_t bucket_bytes : {int64_t{1}, int64_t{1} << 20}) {  // a bucket per parameter; one bucket
    auto p = make_params();
    TwinGroup group;
    GradOverlap overlap(group, p.all(), bucket_bytes);
    EXPECT_EQ(overlap.buckets(), bucket_bytes == 1 ? 4u : 1u);
    micro_batch_loss(p, 0).backward();  // not armed: plain accumulation
    EXPECT_TRUE(group.started.empty());
    overlap.arm();
    group.in_backward = true;
    micro_batch_loss(p, 1).backward();
    group.in_backward = false;
    const auto had = overlap.finish();
    EXPECT_TRUE(torch::equal(had, torch::tensor({1.0f, 1.0f, 1.0f, 0.0f}))) << "d has no gradient of its own";
    EXPECT_TRUE(torch::allclose(p.a.grad(), 2 * ref.a.grad(), 1e-12, 0)) << bucket_bytes;
    EXPECT_TRUE(torch::allclose(p.b.grad(), 2 * ref.b.grad(), 1e-12, 0)) << bucket_bytes;
    EXPECT_TRUE(torch::allclose(p.c.grad(), 2 * ref.c.grad(), 1e-12, 0)) << "from the first micro-batch only";
    EXPECT_TRUE(torch::equal(p.d.grad(), torch::zeros({5}, torch::kFloat64)));
    if (bucket_bytes == 1) {
      // reverse registration order: d, c, b, a. d and c get no gradient in the armed backward,
      // so d's bucket holds every later one until finish(): none starts during the backward...
      EXPECT_EQ(group.started_in_backward, 0);
      EXPECT_EQ(group.started.size(), 4u);
    }
  }
  // ...while a model whose every parameter has its gradient starts b's and a's sums in the backward
  auto p = make_params();
  TwinGroup group;
  GradOverlap overlap(group, {p.a, p.b}, 1);
  overlap.arm();
  group.in_backward = true;
  micro_batch_loss(p, 1).backward();
  group.in_backward = false;
  EXPECT_EQ(overlap.started_in_backward(), 2u);
  EXPECT_EQ(group.started_in_backward, 2);
  ASSERT_EQ(group.started.size(), 2u);
  EXPECT_EQ(group.started, (std::vector<int64_t>{6, 12})) << "b's bucket (registered last) first, then a's";
  overlap.finish();
  EXPECT_EQ(group.started.size(), 2u);  // nothing left for finish()
  auto ref2 = make_params();
  micro_batch_loss(ref2, 1).backward();
  EXPECT_TRUE(torch::allclose(p.b.grad(), 2 * ref2.b.grad(), 1e-12, 0));
  EXPECT_TRUE(torch::allclose(p.a.grad(), 2 * ref2.a.grad(), 1e-12, 0));
}
