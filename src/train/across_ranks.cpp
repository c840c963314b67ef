#include "train/across_ranks.h"

#include "io/checkpoint.h"
#include "model/moe_ffn.h"
#include "train/fused_adamw.h"
#include "train/grad_overlap.h"
#include "train/parallel.h"

namespace mf {
namespace {

// Σ |g|² over the defined gradients, float64, 0-dim (no sync)
at::Tensor squared_norm(const std::vector<at::Tensor>& params) {
  auto sum = at::zeros({}, at::kDouble);
  for (auto& p : params)
    if (p.grad().defined()) sum = sum + p.grad().norm().to(at::kDouble).square();
  return sum;
}

}  // namespace

double sum_over_ranks(DataParallel& par, const std::vector<at::Tensor>& params,
                      const std::vector<std::shared_ptr<MoEFeedForward>>& moe, double loss_sum, GradOverlap* overlap) {
  std::vector<at::Tensor> tensors;
  at::Tensor had;  // which gradients this rank has
  if (overlap) {
    had = overlap->finish();
  } else {
    had = torch::zeros({static_cast<int64_t>(params.size())}, torch::kFloat);
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined())
        had.data_ptr<float>()[i] = 1;
      else
        params[i].mutable_grad() = torch::zeros_like(params[i]);
      tensors.push_back(params[i].mutable_grad());
    }
  }
  const size_t at = tensors.size();
  tensors.push_back(had);
  tensors.push_back(torch::tensor({loss_sum}, torch::kFloat64));
  for (auto& m : moe)
    if (m->pending_load().defined()) tensors.push_back(m->pending_load());
  par.sum(tensors);
  const float* any = had.data_ptr<float>();  // ranks holding each gradient
  for (size_t i = 0; i < params.size(); ++i)
    if (any[i] == 0) params[i].mutable_grad() = at::Tensor();
  return tensors[at + 1].item<double>();
}

bool is_among(const at::Tensor& t, const std::vector<at::Tensor>& list) {
  for (auto& s : list)
    if (s.is_same(t)) return true;
  return false;
}

std::vector<at::Tensor> without(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& sharded) {
  std::vector<at::Tensor> out;
  for (auto& p : params)
    if (!is_among(p, sharded)) out.push_back(p);
  return out;
}

void narrow_optimizer_state(torch::optim::AdamW& opt, const std::vector<at::Tensor>& sharded, int rank) {
  auto& state = opt.state();
  for (auto& p : sharded) {
    auto it = state.find(optimizer_state_key(p));
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    const int64_t n = p.size(0);
    if (s.exp_avg().size(0) == n) continue;  // already this rank's
    s.exp_avg(s.exp_avg().narrow(0, rank * n, n).clone());
    s.exp_avg_sq(s.exp_avg_sq().narrow(0, rank * n, n).clone());
  }
}

double clip_grad_norm(DataParallel& group, const std::vector<at::Tensor>& replicated,
                      const std::vector<at::Tensor>& sharded, double max_norm) {
  std::vector<at::Tensor> local = {squared_norm(sharded).reshape({1})};
  group.sum(local);
  const double norm = std::sqrt((squared_norm(replicated) + local[0][0]).item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1)
    for (const auto* list : {&replicated, &sharded})
      for (auto& p : *list)
        if (p.grad().defined()) p.mutable_grad().mul_(coef);
  return norm;
}

void gather_for_writing(DataParallel& group, NamedTensors& tensors, const std::unordered_set<std::string>& sharded,
                        bool to_rank0) {
  const int W = group.world(), rank = group.rank();
  NamedTensors whole = tensors;  // sharded entries as whole-shape placeholders: what the writers plan with
  for (auto& [name, t] : whole) {
    if (!sharded.count(name)) continue;
    auto shape = t.sizes().vec();
    shape[0] *= W;
    t = at::empty(shape, t.options().device(at::kMeta));
  }
  const auto plan = to_rank0 ? std::vector<int>(tensors.size(), 0) : shard_plan(whole, W);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!sharded.count(tensors[i].first)) continue;
    const auto& slice = tensors[i].second;
    const int64_t n = slice.size(0), row = n == 0 ? 0 : slice.numel() / n;
    const int writer = plan[i];
    auto in = slice.detach().reshape({n, row}).contiguous();
    std::vector<int64_t> in_rows(W, 0), out_rows(W, rank == writer ? n : 0);
    in_rows[writer] = n;
    auto out = at::empty({rank == writer ? W * n : 0, row}, in.options());
    group.all_to_all(out, in, out_rows, in_rows);  // slices arrive in rank order: the whole tensor
    tensors[i].second = rank == writer ? out.view(whole[i].second.sizes()) : whole[i].second;
  }
}

}  // namespace mf
