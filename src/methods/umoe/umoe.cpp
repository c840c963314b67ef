#include "methods/umoe/umoe.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include <filesystem>

#include "core/runtime.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"
#include "io/weight_source.h"

namespace mf {

std::vector<LayerSaliency> checkpoint_saliency(const std::string& checkpoint, const CalibrationSource& calib,
                                               int64_t batch, bool layerwise, LayerwisePeak* peak) {
  const Config cfg = checkpoint_config(checkpoint);
  check_reap_model(cfg.model);
  const auto tokenizer = model_tokenizer(checkpoint);
  const auto windows = calibration_windows(calib, cfg, tokenizer);
  if (layerwise) {
    if (calib.weights != at::kFloat)
      throw ConfigError(
          "--dtype bf16 holds the whole model in bf16; --layerwise holds one float32 block at a time: "
          "choose one");
    return layerwise_saliency(checkpoint, windows, batch, peak);
  }
  auto l = load_model(checkpoint, calib.weights);
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

namespace {

// The surgery's checkpoint tensor by tensor from `src` (peak memory: one tensor, i.e. one layer's
// stacked experts): the tensors no surgery touches as they are, then each MoE layer's per-expert
// tensors in name order, layer after layer: the order the in-memory umoe_surgery draws its noise in.
void write_surgery(const WeightSource& src, const std::vector<LayerSaliency>& saliency, const SurgeryOptions& opt,
                   SurgeryResult& result, const std::string& path, const Metadata& meta) {
  std::vector<TensorSpec> rest, out_specs;
  std::vector<std::vector<TensorSpec>> per_layer(saliency.size());
  for (const auto& spec : src.specs) {
    size_t i = 0;
    while (i < saliency.size() &&
           !is_per_expert(spec.name, spec.shape, saliency[i].layer, static_cast<int64_t>(saliency[i].saliency.size())))
      ++i;
    (i < saliency.size() ? per_layer[i] : rest).push_back(spec);
  }
  out_specs = rest;
  for (size_t i = 0; i < saliency.size(); ++i) {
    const auto router = surgery_prefix(saliency[i].layer) + "gate.weight";
    auto& specs = per_layer[i];
    std::sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    if (std::none_of(specs.begin(), specs.end(),
                     [&](const auto& s) { return s.name == router && s.shape.size() == 2; }))
      throw std::invalid_argument(
          fmt::format("UMoE surgery: no router '{}' of {} rows", router, saliency[i].saliency.size()));
    result.layers.push_back(plan_surgery(saliency[i], result.config, opt));
    for (auto spec : specs) {
      spec.shape[0] = static_cast<int64_t>(result.layers.back().source.size());
      out_specs.push_back(spec);
    }
    if (opt.prune_only) result.config.model.moe.num_experts = static_cast<int64_t>(result.layers.back().source.size());
  }
  auto full_meta = meta;
  full_meta["moeforge.config"] = to_toml(result.config);
  SafetensorsWriter w(path, out_specs, full_meta);
  for (const auto& spec : rest) w.write(src.read(spec));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(opt.seed);
  for (size_t i = 0; i < saliency.size(); ++i)
    for (const auto& spec : per_layer[i]) w.write(operate(spec.name, src.read(spec), result.layers[i], opt, gen));
  w.finish();
}

}  // namespace

UMoEOutcome run_umoe(const std::string& checkpoint, const CalibrationSource& calib, const SurgeryOptions& opt,
                     const std::string& out, int64_t batch, bool layerwise) {
  UMoEOutcome r;
  r.saliency = checkpoint_saliency(checkpoint, calib, batch, layerwise);
  check_surgery_options(opt, r.saliency);
  const auto src = open_weights(checkpoint);  // a Hugging Face directory's tensors under our names
  r.surgery.config = src.config;
  Metadata meta = src.metadata;
  meta["moeforge.step"] = "0";
  meta["moeforge.umoe_from"] = src.dir;
  CheckpointContents contents{{}, {}, {}, {{"step", 0}, {"umoe_from", src.dir}}, src.tokenizer};
  contents.write_model = [&](const std::string& path) { write_surgery(src, r.saliency, opt, r.surgery, path, meta); };
  write_like_source(src, contents, out, src.hf_type);  // a Hugging Face directory in, one of its architecture out
  auto report = surgery_report(r.surgery, r.saliency, opt);
  report["checkpoint"] = src.dir;
  report["calibration"] = {{"source", calib.source},
                           {"samples", calib.samples},
                           {"seq_len", calib.seq_len > 0 ? calib.seq_len : src.config.train.seq_len}};
  r.report_path = out + "/umoe_report.json";
  write_file_atomic(r.report_path, report.dump(2) + "\n");
  write_file_atomic(out + "/saliency.svg",
                    saliency_svg(r.saliency, fmt::format("{} — REAP saliency on {}", src.config.run.name,
                                                         calibration_label(calib.source))));
  return r;
}

}  // namespace mf
