#include "train/optim.h"

#include "core/param_roles.h"
#include "train/fused_adamw.h"

#include <fmt/format.h>

#include <cmath>

namespace mf {
namespace {

bool no_decay(ParamRole role, const TrainConfig& c) {
  return role == ParamRole::Gain || role == ParamRole::Bias || role == ParamRole::Scale ||
         (role == ParamRole::Embedding && !c.decay_embeddings);
}

}  // namespace

std::unique_ptr<torch::optim::AdamW> make_optimizer(torch::nn::Module& model, const TrainConfig& c) {
  std::vector<torch::Tensor> decay, plain;
  const auto roles = collect_param_roles(model);
  for (auto& p : model.named_parameters()) (no_decay(roles.at(p.key()), c) ? plain : decay).push_back(p.value());
  auto opts = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.adam_eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, opts(c.weight_decay));
  groups.emplace_back(plain, opts(0.0));
  return std::make_unique<FusedAdamW>(groups, torch::optim::AdamWOptions(c.lr));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
}

std::vector<at::Tensor> release_grads(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> had;
  for (auto& group : opt.param_groups())
    for (auto& p : group.params())
      if (p.grad().defined()) {
        had.push_back(p);
        p.mutable_grad() = at::Tensor();
      }
  return had;
}

void restore_zero_grads(const std::vector<at::Tensor>& had) {
  for (auto p : had)
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
}

double lr_at(const TrainConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  const double span = std::max<int64_t>(1, c.steps - 1 - c.warmup_steps);
  const double t = std::min(1.0, static_cast<double>(step - c.warmup_steps) / span);
  const double min_lr = c.lr * c.min_lr_ratio;
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

NamedTensors optimizer_state_tensors(torch::optim::AdamW& opt, torch::nn::Module& model) {
  NamedTensors out;
  auto& state = opt.state();
  for (auto& p : model.named_parameters()) {
    auto it = state.find(optimizer_state_key(p.value()));
    if (it == state.end()) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out.emplace_back(p.key() + ".exp_avg", s.exp_avg());
    out.emplace_back(p.key() + ".exp_avg_sq", s.exp_avg_sq());
    out.emplace_back(p.key() + ".step", torch::tensor({static_cast<int64_t>(s.step())}, torch::kLong));
  }
  return out;
}

void load_optimizer_state(torch::optim::AdamW& opt, torch::nn::Module& model, const SafetensorsData& st) {
  auto& state = opt.state();
  state.clear();
  for (auto& p : model.named_parameters()) {
    const auto& name = p.key();
    if (!st.tensors.count(name + ".step")) continue;  // parameter never stepped
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    auto m = st.at(name + ".exp_avg"), v = st.at(name + ".exp_avg_sq");
    if (m.sizes() != p.value().sizes() || v.sizes() != p.value().sizes())
      throw FormatError(fmt::format("optimizer state of '{}' has the wrong shape", name));
    require_dtype("optimizer state", name + ".exp_avg", m.scalar_type(), p.value().scalar_type());
    require_dtype("optimizer state", name + ".exp_avg_sq", v.scalar_type(), p.value().scalar_type());
    const auto& step = st.at(name + ".step");
    if (step.numel() != 1 || !at::isIntegralType(step.scalar_type(), false))
      throw FormatError(fmt::format("optimizer state: '{}.step' must be one integer", name));
    s->step(step.item<int64_t>());
    s->exp_avg(m.to(p.value().dtype()).clone());
    s->exp_avg_sq(v.to(p.value().dtype()).clone());
    state[optimizer_state_key(p.value())] = std::move(s);
  }
}

}  // namespace mf
