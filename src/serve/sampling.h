// Drawing a token from a row of float32 logits without LibTorch: temperature, the nucleus (top-p)
// and one uniform number. LibTorch's softmax -> sort -> cumsum -> multinomial took 160 us per token
// at top-p 1 and 700 us at 0.9 for a vocabulary of 8,192 (two or more decode steps of the
// quickstart model); this takes a pass for the exponentials, ~30 vectorised passes to find the
// nucleus's edge and one to draw.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mf {

// The distribution sample_token draws from, as probabilities (V doubles): softmax(logits / T)
// kept to its nucleus and renormalised. The nucleus: the most probable tokens in order (ties in
// index order) while the mass before each is below top_p (the first always kept; top_p >= 1 keeps
// every token). A -inf logit has probability 0; a NaN or +inf one is an error.
void nucleus_probs(const float* logits, int64_t V, double temperature, double top_p, double* probs);
// One draw from that distribution with `gen` (a CPU generator): one 53-bit uniform number.
int64_t sample_token(const float* logits, int64_t V, double temperature, double top_p, at::Generator& gen);

}  // namespace mf
