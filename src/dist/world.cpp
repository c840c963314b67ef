#include "dist/world.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

namespace mf {
namespace {

int env_int(const char* name, int lo, int hi, std::optional<int> fallback = std::nullopt) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback) return *fallback;
    throw std::runtime_error(
        fmt::format("{} is not set (WORLD_SIZE > 1 needs RANK, MASTER_ADDR and MASTER_PORT; "
                    "`moeforge launch` sets them)",
                    name));
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw std::runtime_error(fmt::format("{}='{}' must be an integer in [{}, {}]", name, v, lo, hi));
  return static_cast<int>(x);
}

}  // namespace

std::optional<WorldEnv> world_from_env() {
  const int world = env_int("WORLD_SIZE", 1, 65536, 1);
  if (world == 1) return std::nullopt;
  WorldEnv w;
  w.world = world;
  w.rank = env_int("RANK", 0, world - 1);
  w.local_rank = env_int("LOCAL_RANK", 0, 65535, 0);
  const char* addr = std::getenv("MASTER_ADDR");
  if (!addr || !*addr) throw std::runtime_error("MASTER_ADDR is not set (the host of rank 0)");
  w.master_addr = addr;
  w.master_port = env_int("MASTER_PORT", 1, 65535);
  w.timeout_s = env_int("MOEFORGE_DIST_TIMEOUT", 1, 86400, 300);
  return w;
}

}  // namespace mf
