#include "methods/methods.h"

#include <fmt/format.h>

#include <mutex>

#include "core/config.h"
#include "methods/intb/intb.h"
#include "methods/intb/repro.h"
#include "methods/intb/smear.h"
#include "methods/latent/latent.h"
#include "methods/latent/repro.h"
#include "methods/umoe/repro.h"
#include "methods/unif/repro.h"
#include "methods/unif/unif.h"
#include "methods/unipool/repro.h"
#include "methods/unipool/unipool.h"
#include "model/moe_ffn.h"
#include "train/repro_report.h"

namespace mf {

void register_builtin_methods() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_latent();
    register_unipool();
    register_unif();
    register_intb();
    register_smear();
    // the reproductions whose results.md is rendered from results.json
    register_repro_render("unipool", render_unipool_results);
    register_repro_render("latent", render_latent_results);
    register_repro_render("umoe", render_umoe_results);
    register_repro_render("unif", render_unif_results);
    register_repro_render("intb", render_intb_results);
    // UniF-MoE replaces the whole routed path, so it composes with neither pools nor latent experts
    register_config_validator([](const Config& c) {
      if (c.model.moe.section<UniFConfig>().blocks == 0) return;
      if (c.model.moe.section<UniPoolConfig>().groups > 0)
        throw ConfigError("model.moe.unif.blocks cannot be combined with model.moe.unipool.groups");
      if (!c.model.moe.section<LatentConfig>().shapes.empty())
        throw ConfigError("model.moe.unif.blocks cannot be combined with model.moe.latent.shapes");
    });
    // last: the model's own check that the configured FFN kind exists and every MoE block's
    // shape, after every method, is buildable
    register_config_validator([](const Config& c) {
      if (!is_ffn_kind(c.model.ffn))
        throw ConfigError(
            fmt::format("model.ffn = \"{}\" is not a known FFN-slot kind (swiglu, gelu, moe)", c.model.ffn));
      if (c.model.ffn == "moe") plan_moe(c.model);
    });
  });
}

}  // namespace mf
