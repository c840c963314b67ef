// `moeforge launch`: starts the local workers of a run with the standard variables set (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), like torchrun, and watches them: when one
// fails, the others are stopped (SIGTERM, then SIGKILL after a grace period) and launch exits
// non-zero naming the rank. SIGINT / SIGTERM to launch are passed on to the workers.
#pragma once
#include <string>
#include <vector>

namespace mf {

struct LaunchOptions {
  int nproc = 1;  // workers on this node
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;     // 0: a free port of this machine (single node only)
  int grace_seconds = 10;  // SIGTERM -> SIGKILL
};

// Runs `args` (a moeforge command line without the program name) in every worker; returns
// the exit code for launch itself.
int launch(const LaunchOptions& opt, const std::vector<std::string>& args);

}  // namespace mf
