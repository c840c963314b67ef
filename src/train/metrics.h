// metrics.jsonl: one JSON object per line, flushed as written.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace mf {

class MetricsLog {
 public:
  // keep_until_step >= 0: a resumed run first drops lines written after that step; path "": a
  // log that writes nothing
  MetricsLog(const std::string& path, int64_t keep_until_step);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
  std::string path_;
};

std::vector<nlohmann::json> read_metrics(const std::string& path);

}  // namespace mf
