#include "core/peer.h"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

namespace mf {

nlohmann::json run_peer(const std::string& script, const std::string& args, bool default_env) {
  if (!std::filesystem::exists(script)) return {{"skipped", "peer script not found: " + script}};
  const std::string cmd = fmt::format(
      "{}/usr/bin/python3 '{}' {} 2>&1",
      default_env ? "env -u OMP_WAIT_POLICY -u OPENBLAS_CORETYPE -u OPENBLAS_THREAD_TIMEOUT " : "", script, args);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {{"skipped", "cannot run python3"}};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  auto line = out.substr(out.rfind('{') == std::string::npos ? 0 : out.rfind('{'));
  if (rc != 0 || line.empty() || line[0] != '{')
    return {{"skipped", "peer failed (is python3-torch installed?): " + out.substr(0, 200)}};
  return nlohmann::json::parse(line);
}

}  // namespace mf
