#include "train/metrics.h"

#include <fmt/format.h>

#include <filesystem>
#include <sstream>
#include <stdexcept>

#include "core/util.h"

namespace mf {

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  if (!std::filesystem::exists(path)) return out;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {  // a line cut short by a crash
    }
  }
  return out;
}

MetricsLog::MetricsLog(const std::string& path, int64_t keep_until_step) {
  if (path.empty()) return;  // writes nothing (data-parallel ranks other than 0)
  if (keep_until_step >= 0) {
    std::string kept;
    for (auto& r : read_metrics(path))
      if (r.value("step", int64_t{0}) <= keep_until_step) kept += r.dump() + "\n";
    write_file_atomic(path, kept);
  }
  out_.open(path, keep_until_step >= 0 ? std::ios::app : std::ios::trunc);
  if (!out_) throw std::runtime_error(fmt::format("cannot open '{}' for writing", path));
  path_ = path;
}

void MetricsLog::write(const nlohmann::json& record) {
  if (path_.empty()) return;
  out_ << record.dump() << "\n";
  out_.flush();
  if (!out_) throw std::runtime_error(fmt::format("writing '{}' failed (disk full?)", path_));
}

}  // namespace mf
