// The one place the built-in methods are registered: their config sub-tables, validation,
// FFN-slot kinds and MoE extensions. Call once at start-up (the CLI and the tests do) before
// loading any config. Registration order is composition order: latent reshapes a layer before
// UniPool pools the reshaped experts.
#pragma once

namespace mf {

void register_builtin_methods();

}  // namespace mf
