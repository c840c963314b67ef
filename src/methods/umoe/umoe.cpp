#include "methods/umoe/umoe.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/runtime.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"

namespace mf {

std::vector<LayerSaliency> checkpoint_saliency(const std::string& checkpoint, const CalibrationSource& calib,
                                               int64_t batch, bool layerwise, LayerwisePeak* peak) {
  const Config cfg = checkpoint_config(checkpoint);
  check_reap_model(cfg.model);
  const auto tokenizer = model_tokenizer(checkpoint);
  const auto windows = calibration_windows(calib, cfg, tokenizer);
  if (layerwise) return layerwise_saliency(checkpoint, windows, batch, peak);
  auto l = load_model(checkpoint);
  auto s = model_saliency(*l.model, windows, batch);
  if (peak) peak->peak_rss_bytes = peak_rss_bytes();
  return s;
}

SaliencyRun write_saliency(const std::string& checkpoint, const CalibrationSource& calib, int64_t batch, bool layerwise,
                           const std::string& prefix) {
  SaliencyRun r;
  r.layers = checkpoint_saliency(checkpoint, calib, batch, layerwise, &r.peak);
  const auto dir = checkpoint_dir(checkpoint);
  const auto label = calibration_label(calib.source);
  r.prefix = prefix.empty() ? (std::filesystem::path(dir) / ("saliency_" + label)).string() : prefix;
  nlohmann::json j = {{"checkpoint", dir},
                      {"calibration", calib.source},
                      {"samples", calib.samples},
                      {"layerwise", layerwise},
                      {"peak_rss_bytes", r.peak.peak_rss_bytes},
                      {"layers", saliency_json(r.layers)}};
  if (layerwise) j["model_bytes"] = r.peak.model_bytes, j["largest_block_bytes"] = r.peak.largest_block_bytes;
  write_file_atomic(r.prefix + ".json", j.dump(2) + "\n");
  write_file_atomic(r.prefix + ".svg", saliency_svg(r.layers, "REAP saliency on " + label));
  return r;
}

UMoEOutcome run_umoe(const std::string& checkpoint, const CalibrationSource& calib, const SurgeryOptions& opt,
                     const std::string& out, int64_t batch, bool layerwise) {
  UMoEOutcome r;
  r.saliency = checkpoint_saliency(checkpoint, calib, batch, layerwise);
  const auto weights = model_weights(checkpoint);  // a Hugging Face directory's under our names
  const auto from = hf::is_hf_dir(checkpoint) ? checkpoint : checkpoint_dir(checkpoint);
  const Config cfg = checkpoint_config(checkpoint);
  r.surgery = umoe_surgery(weights.tensors, cfg, r.saliency, opt);
  Metadata meta = weights.metadata;
  meta["moeforge.config"] = to_toml(r.surgery.config);
  meta["moeforge.step"] = "0";
  meta["moeforge.umoe_from"] = from;
  NamedTensors tensors(r.surgery.tensors.begin(), r.surgery.tensors.end());
  const auto tokenizer = model_tokenizer(checkpoint);
  auto report = surgery_report(r.surgery, r.saliency, opt);
  report["checkpoint"] = from;
  report["calibration"] = {{"source", calib.source},
                           {"samples", calib.samples},
                           {"seq_len", calib.seq_len > 0 ? calib.seq_len : cfg.train.seq_len}};
  write_checkpoint(
      out,
      {tensors, {}, meta, {{"step", 0}, {"umoe_from", from}}, std::filesystem::exists(tokenizer) ? tokenizer : ""});
  r.report_path = out + "/umoe_report.json";
  write_file_atomic(r.report_path, report.dump(2) + "\n");
  write_file_atomic(
      out + "/saliency.svg",
      saliency_svg(r.saliency, fmt::format("{} — REAP saliency on {}", cfg.run.name, calibration_label(calib.source))));
  return r;
}

}  // namespace mf
