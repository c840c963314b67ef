// UMoE end to end on a checkpoint: calibration -> REAP saliency -> surgery -> a checkpoint of
// the same architecture (or, prune-only, fewer experts) plus umoe_report.json. The domain
// fine-tune that follows is `moeforge train --init-from OUT` with the data restricted to the
// target domain (data.weight_<domain>); the optimizer and learning-rate schedule start fresh.
#pragma once
#include <string>

#include "methods/umoe/calibration.h"
#include "methods/umoe/surgery.h"

namespace mf {

// Saliency of a checkpoint's MoE layers on a calibration source; `layerwise` streams one
// block at a time (`peak` then records memory).
std::vector<LayerSaliency> checkpoint_saliency(const std::string& checkpoint, const CalibrationSource& calib,
                                               int64_t batch, bool layerwise, LayerwisePeak* peak = nullptr);

struct SaliencyRun {
  std::vector<LayerSaliency> layers;
  LayerwisePeak peak;
  std::string prefix;
};
// `moeforge saliency`: checkpoint_saliency written as PREFIX.json and PREFIX.svg (prefix "":
// CHECKPOINT_DIR/saliency_SOURCE).
SaliencyRun write_saliency(const std::string& checkpoint, const CalibrationSource& calib, int64_t batch, bool layerwise,
                           const std::string& prefix);

struct UMoEOutcome {
  std::vector<LayerSaliency> saliency;
  SurgeryResult surgery;
  std::string report_path;
};
// Writes the checkpoint to `out` (atomically), out/umoe_report.json and out/saliency.svg. Streamed:
// one tensor in memory at a time (and with `layerwise`, one block for the calibration). From a
// Hugging Face directory, `out` is one of the same architecture and dtype (config.json with the
// new expert count; tokenizer files carried), written through a checkpoint of ours beside it.
UMoEOutcome run_umoe(const std::string& checkpoint, const CalibrationSource& calib, const SurgeryOptions& opt,
                     const std::string& out, int64_t batch = 8, bool layerwise = false);

}  // namespace mf
