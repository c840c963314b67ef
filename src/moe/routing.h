// What a router hands the dispatcher: one row per (token, unit) pair, plus named losses
// and statistics. The number of pairs per token may vary (top-p routing).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace mf {

struct Assignment {
  at::Tensor token;   // [N] int64: token row of pair i
  at::Tensor unit;    // [N] int64: unit (expert) of pair i
  at::Tensor weight;  // [N] combine weight (differentiable through the router)
  int64_t num_tokens = 0, num_units = 0;
};

struct RoutingStats {
  std::vector<int64_t> load;  // pairs per unit
  double entropy = 0;         // mean per-token entropy of the routing distribution (nats)
  double mean_units_per_token = 0;
  int64_t dropped = 0;        // pairs dropped by a capacity limit
  std::vector<std::pair<std::string, double>> losses;
  int64_t dead_units() const;
  double max_over_mean() const;
  double cv() const;  // coefficient of variation of the load
};

struct RouterOutput {
  Assignment assignment;
  std::vector<std::pair<std::string, at::Tensor>> losses;  // already scaled by their coefficients
  at::Tensor probs;   // [T, E] routing distribution (for statistics), no grad
  at::Tensor scores;  // [T, E] the scores balance losses act on (softmax probs or NormRouter s), with grad
};

// Routing statistics of one forward pass (no autograd).
RoutingStats routing_stats(const RouterOutput& out);

}  // namespace mf
