// The upcycled FFN slots of a trained checkpoint, as `repro unif` measures them: their routing
// statistics on held-out data (activated blocks C_B, k, b) and their inference time, re-timed
// in interleaved rounds on the hidden states they saw there.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "core/timing.h"  // median, median_ratio
#include "model/layers.h"

namespace mf {

// One checkpoint's upcycled slots with the inputs they received in an evaluation.
struct CapturedSlots {
  std::vector<std::shared_ptr<FeedForward>> slots;
  std::vector<torch::Tensor> inputs_TD;  // per slot, the first `tokens` inputs it saw
  double blocks = 0, k = 0, b = 0;       // per token, mean over the slots (top-k: k·B; dense: B, 1, 0)
};

// Runs checkpoint `dir` on held-out data (LM: `windows` val windows of `domain`; ViT: the first
// `windows` x 16 test images) and keeps blocks `layers`' slots with their first `tokens` inputs.
CapturedSlots capture_slots(const std::string& dir, const std::vector<int64_t>& layers, int64_t B,
                            const std::string& domain, int64_t windows, int64_t tokens);

// Each arm's slots run once per round on their captured inputs, arms in turn, no grad: per arm
// the seconds of each round (all its slots together). A slow phase of a shared machine then hits
// every arm of a round alike.
std::map<std::string, std::vector<double>> time_in_rounds(const std::map<std::string, CapturedSlots>& arms, int rounds);

}  // namespace mf
