// The standard variables of torchrun, SLURM wrappers and `moeforge launch`: RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT; and MOEFORGE_DIST_TIMEOUT (seconds, default 300): how
// long a rank waits for the others to join or to reach a collective before it stops with an
// error (a stalled rank). A worker with WORLD_SIZE > 1 joins a group.
#pragma once
#include <optional>
#include <string>

namespace mf {

struct WorldEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int timeout_s = 300;  // MOEFORGE_DIST_TIMEOUT: bounds the rendezvous and every collective
};

// nullopt when WORLD_SIZE is unset or 1; throws naming the variable on a bad or missing value.
std::optional<WorldEnv> world_from_env();

}  // namespace mf
