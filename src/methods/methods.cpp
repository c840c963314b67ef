#include "methods/methods.h"

#include <fmt/format.h>

#include <mutex>

#include "core/config.h"
#include "methods/latent/latent.h"
#include "methods/unipool/unipool.h"
#include "model/moe_ffn.h"

namespace mf {

void register_builtin_methods() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_latent();
    register_unipool();
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
