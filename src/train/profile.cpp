#include "train/profile.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "core/util.h"
#include "io/safetensors.h"

namespace mf {

std::vector<OpSelfTime> self_times(const nlohmann::json& trace) {
  const auto& events = trace.is_object() ? trace.at("traceEvents") : trace;
  struct Event {
    std::string name;
    double start, dur;
  };
  std::map<std::string, std::vector<Event>> by_thread;
  for (const auto& e : events)
    if (e.value("ph", "") == "X")
      by_thread[e.at("tid").dump()].push_back(
          {e.at("name").get<std::string>(), e.at("ts").get<double>(), e.at("dur").get<double>()});
  std::map<std::string, OpSelfTime> ops;
  for (auto& [tid, list] : by_thread) {
    // parents before their children: earlier start first, the longer one on equal starts
    std::sort(list.begin(), list.end(),
              [](const Event& a, const Event& b) { return a.start != b.start ? a.start < b.start : a.dur > b.dur; });
    std::vector<std::pair<double, OpSelfTime*>> open;  // (end, op) of the enclosing events
    for (const auto& e : list) {
      while (!open.empty() && open.back().first <= e.start) open.pop_back();
      auto& op = ops[e.name];
      op.name = e.name;
      op.calls += 1;
      op.self_us += e.dur;
      if (!open.empty()) open.back().second->self_us -= e.dur;
      open.emplace_back(e.start + e.dur, &op);
    }
  }
  std::vector<OpSelfTime> out;
  for (auto& [name, op] : ops) out.push_back(op);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.self_us > b.self_us; });
  return out;
}

std::string self_time_table(const std::vector<OpSelfTime>& ops, int64_t steps, size_t rows) {
  double total = 0;
  for (const auto& op : ops) total += op.self_us;
  std::string s = fmt::format("{:<60} {:>11} {:>13} {:>7}\n", "operator", "calls/step", "self ms/step", "share");
  for (size_t i = 0; i < std::min(rows, ops.size()); ++i) {
    const auto& op = ops[i];
    auto name = op.name.size() > 60 ? op.name.substr(0, 57) + "..." : op.name;
    s += fmt::format("{:<60} {:>11.1f} {:>13.2f} {:>6.1f}%\n", name, static_cast<double>(op.calls) / steps,
                     op.self_us / 1e3 / steps, 100 * op.self_us / std::max(total, 1e-9));
  }
  s += fmt::format("{:<60} {:>11} {:>13.2f} {:>6.1f}%\n", "all operators", "", total / 1e3 / steps, 100.0);
  return s;
}

struct StepProfiler::Recording {
  torch::autograd::profiler::RecordProfile guard;
  explicit Recording(const std::string& path) : guard(path) {}
};

StepProfiler::StepProfiler(int64_t first, int64_t steps, std::string trace_path, std::string table_path,
                           std::string header)
    : first_(first),
      steps_(steps),
      trace_path_(std::move(trace_path)),
      table_path_(std::move(table_path)),
      header_(std::move(header)) {}

StepProfiler::~StepProfiler() = default;

void StepProfiler::before_step(int64_t step) {
  if (!done_ && !recording_ && step == first_) recording_ = std::make_unique<Recording>(trace_path_);
}

void StepProfiler::after_step(int64_t step) {
  if (!recording_ || step < first_ + steps_) return;
  recording_.reset();  // writes the trace
  done_ = true;
  const auto table = header_ + self_time_table(self_times(read_json_file(trace_path_)), steps_);
  write_file_atomic(table_path_, table);
  spdlog::info("profile of steps {}..{}: {} (trace), {}\n{}", first_ + 1, first_ + steps_, trace_path_, table_path_,
               table);
}

}  // namespace mf
