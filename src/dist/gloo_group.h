// A data-parallel group on PyTorch's c10d: rendezvous through TCPStore (rank 0 hosts it at
// MASTER_ADDR:MASTER_PORT), collectives through ProcessGroupGloo on the CPU. A rank that dies
// closes its sockets, so the others' next collective fails at once with a clear error.
#pragma once
#include <memory>

#include "dist/world.h"
#include "train/parallel.h"

namespace mf {

// Joins the group of `env`: throws naming MASTER_ADDR:MASTER_PORT when the rendezvous fails, the
// ranks that did not join within env.timeout_s, or a RANK two workers claim (every rank then
// stops at once). env.timeout_s also bounds every collective.
std::unique_ptr<DataParallel> join_gloo_group(const WorldEnv& env);

}  // namespace mf
