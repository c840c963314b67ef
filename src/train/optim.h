// AdamW (train/fused_adamw.h) with decay / no-decay parameter groups, the LR schedule, and optimizer state
// to and from named tensors (for checkpoints).
#pragma once
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "core/config.h"
#include "io/safetensors.h"

namespace mf {

// Gains, biases and (unless train.decay_embeddings) the embedding get no decay (core/param_roles.h).
std::unique_ptr<torch::optim::AdamW> make_optimizer(torch::nn::Module& model, const TrainConfig& c);
void set_lr(torch::optim::Optimizer& opt, double lr);

// warmup: lr * (step+1)/warmup; then cosine from lr to lr*min_lr_ratio at the last step
double lr_at(const TrainConfig& c, int64_t step);

// "{param}.exp_avg", "{param}.exp_avg_sq", "{param}.step" for every parameter with state
NamedTensors optimizer_state_tensors(torch::optim::AdamW& opt, torch::nn::Module& model);
void load_optimizer_state(torch::optim::AdamW& opt, torch::nn::Module& model, const SafetensorsData& st);

}  // namespace mf
