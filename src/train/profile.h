// `moeforge train --profile N`: N training steps (after a short warm-up) under LibTorch's
// profiler -> a Chrome trace (chrome://tracing, Perfetto) and a table of operators by self
// time per step, the first thing to read before optimising anything.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mf {

struct OpSelfTime {
  std::string name;
  int64_t calls = 0;
  double self_us = 0;  // time in the op itself, its child ops excluded
};

// Chrome-trace events ("ph": "X", ts / dur in microseconds, per tid) -> operators by self time,
// largest first. A child is an event of the same thread inside its parent's interval.
std::vector<OpSelfTime> self_times(const nlohmann::json& trace);

// "op | calls/step | self ms/step | share" for the top rows
std::string self_time_table(const std::vector<OpSelfTime>& ops, int64_t steps, size_t rows = 25);

class StepProfiler {
 public:
  // profiles steps [first, first + steps) of the loop; writes trace_path and table_path, the
  // table under `header` (e.g. which kernels ran)
  StepProfiler(int64_t first, int64_t steps, std::string trace_path, std::string table_path, std::string header = "");
  ~StepProfiler();
  void before_step(int64_t step);
  void after_step(int64_t step);  // step: the number of steps done, as the trainer counts
  bool done() const { return done_; }

 private:
  struct Recording;
  int64_t first_, steps_;
  std::string trace_path_, table_path_, header_;
  std::unique_ptr<Recording> recording_;
  bool done_ = false;
};

}  // namespace mf
