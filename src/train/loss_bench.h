// `moeforge bench loss`: the LM head + next-token loss, forward and backward, computed as
// logits then cross entropy against the fused, chunked loss (model/fused_loss.h): time and
// peak memory above the inputs, at a vocabulary size of the caller's (Qwen3's is 151,936).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/table.h"

namespace mf {

struct LossBenchRow {
  std::string name;
  double seconds = 0;      // best forward + backward
  int64_t peak_bytes = 0;  // peak RSS above the resident inputs
  double loss = 0;
};

std::vector<LossBenchRow> bench_lm_loss(int64_t tokens, int64_t d_model, int64_t vocab, int iters, int64_t chunk = 0);
ResultTable loss_table(const std::vector<LossBenchRow>& rows);

}  // namespace mf
