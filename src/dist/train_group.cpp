#include "dist/train_group.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "dist/expert_parallel.h"
#include "dist/gloo_group.h"
#include "dist/world.h"

namespace mf {

std::unique_ptr<DataParallel> join_training_group(TrainOptions& opt, bool expert_parallel) {
  auto world = world_from_env();
  if (!world) {
    if (expert_parallel) spdlog::warn("--expert-parallel: one process (WORLD_SIZE unset or 1), nothing to split");
    return nullptr;
  }
  if (world->rank > 0) spdlog::set_level(spdlog::level::warn);
  auto group = join_gloo_group(*world);
  opt.parallel = group.get();
  if (expert_parallel)
    opt.distribute = [g = group.get()](const std::vector<std::shared_ptr<FeedForward>>& ffns) {
      auto ep = enable_expert_parallel(ffns, *g);
      Distributed d{ep.layers == 0
                        ? std::string("expert parallel: no layer to split (UniF-MoE and IntBMoE layers "
                                      "route on their own and stay data parallel)")
                        : fmt::format("expert parallel: {} MoE layers, their experts split over {} ranks "
                                      "(each keeps 1/{} of their {:.2f}M parameters)",
                                      ep.layers, g->world(), g->world(), static_cast<double>(ep.whole) / 1e6),
                    std::move(ep.sharded)};
      spdlog::info("{}", d.description);
      return d;
    };
  return group;
}

}  // namespace mf
