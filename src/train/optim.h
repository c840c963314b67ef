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

// zero_grad without its passes over the gradients: each parameter's gradient is released, so the
// backward's own tensor becomes it instead of being added into zeros (for the experts of a
// fine-grained MoE, 16 bytes of memory traffic a float32 parameter a step). Returns the parameters that had one;
// restore_zero_grads then gives those still without one zeros, as zero_grad left them (AdamW
// still decays them and moves their moments), so the update is the same bit for bit.
std::vector<at::Tensor> release_grads(torch::optim::Optimizer& opt);
void restore_zero_grads(const std::vector<at::Tensor>& had);

// warmup: lr * (step+1)/warmup; then cosine from lr to lr*min_lr_ratio at the last step
double lr_at(const TrainConfig& c, int64_t step);

// "{param}.exp_avg", "{param}.exp_avg_sq", "{param}.step" for every parameter with state
NamedTensors optimizer_state_tensors(torch::optim::AdamW& opt, torch::nn::Module& model);
void load_optimizer_state(torch::optim::AdamW& opt, torch::nn::Module& model, const SafetensorsData& st);

}  // namespace mf
