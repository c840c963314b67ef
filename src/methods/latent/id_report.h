// `moeforge id`: a checkpoint's layerwise intrinsic dimension written as PREFIX.json and
// PREFIX.svg, and, given a reference layer and two latent widths, the two-segment allocation it
// suggests as PREFIX_allocation.toml.
#pragma once
#include <optional>
#include <string>

#include "methods/latent/intrinsic_dim.h"
#include "methods/latent/shape.h"

namespace mf {

struct IdRequest {
  std::string checkpoint, data_dir, prefix;  // "": the config's data.dir; CHECKPOINT_DIR/id
  int64_t collect = 20000, keep = 5000;
  uint64_t seed = 0;
  std::optional<MoELayerShape> reference;  // with narrow and wide > 0: the allocation
  int64_t narrow = 0, wide = 0, multiple = 64;
};

struct IdReport {
  IdProfile profile;
  int64_t split = -1;  // two_segment_split of the profile
  std::optional<TwoSegment> allocation;
  std::string prefix;
};

IdReport write_id_report(const IdRequest& r);

}  // namespace mf
