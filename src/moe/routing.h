// What a router hands the dispatcher: one row per routed (token, unit) pair, plus named
// losses; and the routing statistics, kept as tensors until a logging step reads them.
//
// Tensor names end in their shape letters (x_TD, logits_TE): src/core/shapes.h.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace mf {

struct Assignment {
  at::Tensor token_P;   // int64: token row of pair p
  at::Tensor unit_P;    // int64: unit (expert) of pair p
  at::Tensor weight_P;  // combine weight (differentiable through the router)
  int64_t num_tokens = 0, num_units = 0;
  // pairs already grouped by unit in ascending order, tokens ascending within a unit (what
  // dispatch's stable sort would give): dispatch skips the sort
  bool sorted_by_unit = false;
};

// A per-token integer a method reports (e.g. how many units each token used), with its
// largest possible value so its histogram has a fixed length.
struct TokenCount {
  std::string name;
  at::Tensor count_T;  // int64 [T]
  int64_t max = 0;
};

struct RouterOutput {
  Assignment assignment;
  std::vector<TokenCount> counts;
  std::vector<std::pair<std::string, at::Tensor>> losses;  // already scaled by their coefficients
  at::Tensor scores_TE;  // what balance losses act on (softmax probs, sigmoid or NormRouter scores), with grad
};

// The statistics of one forward pass, as device tensors (no sync): tally() after every
// forward (no host work), read() only when someone looks (a logging step, an analysis).
struct RoutingTally {
  at::Tensor load_E;     // int64 pairs per unit
  at::Tensor scores_TE;  // detached; the routing entropy is computed from it only when read
  at::Tensor dropped;    // int64 scalar: pairs dropped by a capacity limit
  int64_t pairs = 0, tokens = 0;
  std::vector<std::pair<std::string, at::Tensor>> losses;  // detached
  std::vector<TokenCount> counts;                          // detached
};

struct RoutingStats {
  std::vector<int64_t> load;  // pairs per unit
  double entropy = 0;
  double mean_units_per_token = 0;
  int64_t dropped = 0;
  std::vector<std::pair<std::string, double>> losses;
  struct Count {
    std::string name;
    double mean = 0;
    std::vector<int64_t> histogram;  // tokens with value 0, 1, ..., max
  };
  std::vector<Count> counts;
  int64_t dead_units() const;
  double max_over_mean() const;
  double cv() const;  // coefficient of variation of the load
};

RoutingTally tally_routing(const RouterOutput& out);
RoutingStats read_routing(const RoutingTally& t);  // the one device sync

}  // namespace mf
