#include "analysis/report.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <filesystem>
#include <set>

#include "analysis/report_assets.h"  // generated: kReportJs, kReportCss
#include "analysis/svg_plot.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "model/method_info.h"
#include "train/metrics.h"

namespace fs = std::filesystem;

namespace mf {
namespace {

// Per-layer routing fields that are not losses (everything else numeric in a layer record is
// one of the layer's auxiliary losses: aux, z, seq_aux, pool_aux, div, ...).
const std::set<std::string> kRoutingFields = {"layer",           "cv",      "max_over_mean", "entropy",  "dead",
                                              "units_per_token", "dropped", "load_min",      "load_max", "norm_scale",
                                              "gate_scale"};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

struct Method {
  std::string name, panel, note, units = "experts per token";
  bool pooled = false;
  std::vector<std::string> facts;  // the method's config keys
};

Method named(std::string name, std::string panel, std::string note = "") {
  Method m;
  m.name = std::move(name), m.panel = std::move(panel), m.note = std::move(note);
  return m;
}

// The methods the run's config enables (registered by each method: model/method_info.h); the
// first pooled one gives the routing panel. A config this version cannot load is named by its
// model.ffn alone, with the reason.
Method method_of(const std::string& text, const std::string& source) {
  Config c;
  try {
    apply_toml_text(c, text, source);
  } catch (const ConfigError& e) {
    return named("model.ffn = " + c.model.ffn, "Routing", std::string("not read: ") + e.what());
  }
  if (c.model.ffn == "swiglu" || c.model.ffn == "gelu") {
    auto dense = named("dense " + c.model.ffn, "");
    dense.units.clear();
    return dense;
  }
  const auto on = methods_enabled(c);
  if (on.empty()) return named(c.model.ffn == "moe" ? "top-k MoE" : c.model.ffn, "Routing");
  const auto* lead = on.front();
  for (auto* m : on)
    if (m->pooled) {
      lead = m;
      break;
    }
  Method out = named("", lead->panel);
  out.units = lead->units, out.pooled = lead->pooled;
  for (auto* m : on) {
    out.name += (out.name.empty() ? "" : " + ") + m->name;
    out.note += (out.note.empty() ? "" : " ") + m->note;
    out.facts.insert(out.facts.end(), m->facts.begin(), m->facts.end());
  }
  return out;
}

nlohmann::json facts_of(const toml::table& cfg, const nlohmann::json& env, const Method& method) {
  nlohmann::json f = nlohmann::json::object();
  const auto put = [&](const std::string& key) {
    if (auto n = cfg.at_path(key); n) {
      if (auto s = n.value<std::string>())
        f[key] = *s;
      else if (auto i = n.value<int64_t>())
        f[key] = *i;
      else if (auto d = n.value<double>())
        f[key] = *d;
      else if (auto b = n.value<bool>())
        f[key] = *b;
    }
  };
  f["method"] = method.name;
  for (auto key : {"model.task", "model.d_model", "model.n_layers", "model.n_heads", "model.ffn", "model.ffn_hidden"})
    put(key);
  if (cfg.at_path("model.task").value_or(std::string("lm")) == "classify")
    for (auto key : {"model.image_size", "model.patch_size", "model.pool"}) put(key);
  if (method.name.rfind("dense", 0) != 0)
    for (auto key : {"model.moe.layers", "model.moe.num_experts", "model.moe.top_k", "model.moe.expert_hidden",
                     "model.moe.router", "model.moe.n_shared", "model.moe.aux_loss_coef", "model.moe.bias_update"})
      put(key);
  for (auto& key : method.facts) put(key);
  for (auto key : {"train.steps", "train.batch_size", "train.seq_len", "train.grad_accum", "train.lr",
                   "train.weight_decay", "train.seed", "train.threads"})
    put(key);
  for (auto& [k, v] : env.items()) f["environment." + k] = v;
  return f;
}

// Every stride-th element and the last: at most `max_points` points per series.
std::vector<size_t> thin(size_t n, int64_t max_points) {
  const size_t stride =
      std::max<size_t>(1, (n + static_cast<size_t>(max_points) - 1) / static_cast<size_t>(max_points));
  std::vector<size_t> keep;
  for (size_t i = 0; i < n; i += stride) keep.push_back(i);
  if (n && keep.back() != n - 1) keep.push_back(n - 1);
  return keep;
}

double number_or_null(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : std::nan(""); }

nlohmann::json moe_layers_json(const std::vector<const nlohmann::json*>& records) {
  nlohmann::json layers = nlohmann::json::array();
  if (records.empty()) return layers;
  const auto& last = records.back()->at("moe");
  for (size_t i = 0; i < last.size(); ++i) {
    nlohmann::json L = {{"layer", last[i].value("layer", int64_t{0})},
                        {"load", last[i].value("load", nlohmann::json::array())}};
    std::set<std::string> keys, losses, counts;
    for (auto& [k, v] : last[i].items()) {
      if (!v.is_number() || k == "layer") continue;
      keys.insert(k);
      if (kRoutingFields.count(k)) continue;
      if (ends_with(k, "_mean"))
        counts.insert(k);
      else
        losses.insert(k);
    }
    for (auto& k : keys) {
      nlohmann::json ys = nlohmann::json::array();
      for (auto* r : records) {
        const auto& moe = r->at("moe");
        ys.push_back(i < moe.size() && moe[i].contains(k) ? number_or_null(moe[i][k]) : std::nan(""));
      }
      L["series"][k] = ys;
    }
    L["loss_keys"] = losses;
    L["count_keys"] = counts;
    L["hist"] = nlohmann::json::object();
    for (auto& [k, v] : last[i].items())
      if (ends_with(k, "_hist")) L["hist"][k.substr(0, k.size() - 5)] = v;
    layers.push_back(L);
  }
  return layers;
}

// What wrote a picture, by the default names of the analysis commands.
std::string artifact_title(const std::string& file) {
  const std::vector<std::pair<std::string, std::string>> known = {
      {"usage", "expert usage on held-out data (moeforge usage)"},
      {"id", "LatentMoE: intrinsic dimension per block (moeforge id)"},
      {"saliency", "UMoE: REAP expert saliency (moeforge saliency)"},
      {"intb_probe", "IntBMoE: basis removal and recipe similarity (moeforge intb-probe)"},
      {"diagnose", "UniF-MoE: value alignment and residual demand (moeforge diagnose)"},
      {"confusion", "confusion matrix (moeforge eval)"}};
  for (auto& [prefix, title] : known)
    if (file.rfind(prefix, 0) == 0) return title;
  return "";
}

// SVGs written by the analysis commands (usage, probe, diagnose, saliency, eval's confusion
// matrix) into the run or its latest checkpoint; the run's own loss.svg is drawn by the page.
nlohmann::json artifacts_of(const fs::path& run) {
  nlohmann::json out = nlohmann::json::array();
  std::vector<fs::path> dirs = {run};
  if (auto ck = latest_checkpoint(run.string()); !ck.empty()) dirs.push_back(ck);
  for (auto& dir : dirs) {
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() == ".svg" && e.path().filename() != "loss.svg" &&
          e.file_size() < (4u << 20))
        files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& p : files) {
      auto svg = read_file(p.string());
      if (auto at = svg.find("<svg"); at != std::string::npos) svg = svg.substr(at);
      out.push_back(
          {{"file", fs::relative(p, run).string()}, {"title", artifact_title(p.filename().string())}, {"svg", svg}});
    }
  }
  return out;
}

}  // namespace

nlohmann::json collect_report_run(const std::string& run_dir, int64_t max_points) {
  const fs::path run(run_dir);
  if (!fs::is_directory(run) || (!fs::exists(run / "metrics.jsonl") && !fs::exists(run / "config.toml")))
    throw std::runtime_error(
        fmt::format("'{}' is not a run directory (no metrics.jsonl or config.toml in it)", run_dir));
  nlohmann::json r;
  r["dir"] = run_dir;
  r["config"] = fs::exists(run / "config.toml") ? read_file((run / "config.toml").string()) : "";
  toml::table cfg;
  try {
    cfg = toml::parse(r["config"].get<std::string>());
  } catch (const toml::parse_error& e) {
    throw std::runtime_error(fmt::format("{}/config.toml: {}", run_dir, e.description()));
  }
  const auto read_json = [&](const char* name) {
    const auto p = run / name;
    if (!fs::exists(p)) return nlohmann::json::object();
    try {
      return nlohmann::json::parse(read_file(p.string()));
    } catch (const nlohmann::json::parse_error& e) {
      throw FormatError(fmt::format("{}: not valid JSON ({})", p.string(), e.what()));
    }
  };
  const auto env = read_json("environment.json");
  const auto summary = read_json("summary.json");
  const auto method = method_of(r["config"].get<std::string>(), (run / "config.toml").string());
  r["name"] = cfg.at_path("run.name").value_or(run.filename().string());
  r["method"] = method.name;
  r["method_panel"] = method.panel;
  r["method_note"] = method.note;
  r["units_label"] = method.units;
  r["pooled"] = method.pooled;
  r["facts"] = facts_of(cfg, env, method);

  const auto records = read_metrics((run / "metrics.jsonl").string());
  std::vector<const nlohmann::json*> train, val, moe;
  for (auto& rec : records) {
    if (rec.contains("loss")) train.push_back(&rec);
    if (rec.contains("val_loss")) val.push_back(&rec);
    if (rec.contains("moe")) moe.push_back(&rec);
  }
  std::string items = "tokens";
  if (!train.empty())
    for (auto& [k, v] : train.back()->items())
      if (ends_with(k, "_per_s")) items = k.substr(0, k.size() - 6);
  r["items"] = items;
  nlohmann::json t = {{"step", nlohmann::json::array()},
                      {"loss", nlohmann::json::array()},
                      {"lr", nlohmann::json::array()},
                      {"grad_norm", nlohmann::json::array()},
                      {"throughput", nlohmann::json::array()}};
  for (auto i : thin(train.size(), max_points)) {
    const auto& rec = *train[i];
    t["step"].push_back(rec.value("step", int64_t{0}));
    t["loss"].push_back(number_or_null(rec["loss"]));
    t["lr"].push_back(number_or_null(rec.value("lr", nlohmann::json())));
    t["grad_norm"].push_back(number_or_null(rec.value("grad_norm", nlohmann::json())));
    t["throughput"].push_back(number_or_null(rec.value(items + "_per_s", nlohmann::json())));
  }
  r["train"] = t;
  nlohmann::json v = {
      {"step", nlohmann::json::array()}, {"losses", nlohmann::json::object()}, {"accuracy", nlohmann::json::array()}};
  for (auto* rec : val) {
    v["step"].push_back(rec->value("step", int64_t{0}));
    for (auto& [dom, loss] : (*rec)["val_loss"].items()) v["losses"][dom].push_back(number_or_null(loss));
    if (rec->contains("val_accuracy")) v["accuracy"].push_back(number_or_null((*rec)["val_accuracy"]));
  }
  r["val"] = v;
  std::vector<const nlohmann::json*> moe_kept;
  for (auto i : thin(moe.size(), max_points)) moe_kept.push_back(moe[i]);
  r["moe_steps"] = nlohmann::json::array();
  for (auto* rec : moe_kept) r["moe_steps"].push_back(rec->value("step", int64_t{0}));
  r["moe"] = moe_layers_json(moe_kept);
  r["artifacts"] = artifacts_of(run);

  // The summary row: summary.json when the run has finished, else the latest records.
  const int64_t planned = cfg.at_path("train.steps").value_or(int64_t{0});
  const int64_t step = train.empty() ? 0 : train.back()->value("step", int64_t{0});
  r["step"] = step;
  r["train_loss"] = train.empty() ? nlohmann::json() : (*train.back())["loss"];
  r["val_loss"] = val.empty() ? nlohmann::json() : (*val.back())["val_loss_mean"];
  r["val_accuracy"] = val.empty() ? nlohmann::json() : val.back()->value("val_accuracy", nlohmann::json());
  r["throughput"] =
      summary.value(items + "_per_s", train.empty() ? nlohmann::json() : (*train.back())[items + "_per_s"]);
  r["elapsed"] = summary.value("elapsed_s", train.empty() ? nlohmann::json() : (*train.back())["elapsed_s"]);
  r["parameters"] = summary.contains("parameters") ? summary["parameters"] : env.value("parameters", nlohmann::json());
  r["active"] = summary.contains("parameters_active") ? summary["parameters_active"]
                                                      : env.value("parameters_active", nlohmann::json());
  if (summary.value("finished", false) && summary.value("steps", int64_t{-1}) == step)
    r["status"] = "finished";
  else
    r["status"] = fmt::format("step {} of {} (training or stopped)", step, planned);
  return r;
}

std::string report_html(const std::vector<nlohmann::json>& runs, const std::string& title) {
  nlohmann::json data = {{"runs", runs}, {"note", ""}};
  std::string names;
  for (auto& r : runs) names += (names.empty() ? "" : ", ") + r["name"].get<std::string>();
  // "</" inside a <script> element would end it: JSON allows "<\/" for the same text.
  std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  for (size_t at = 0; (at = json.find("</", at)) != std::string::npos; at += 3) json.replace(at, 2, "<\\/");
  const std::string heading = title.empty() ? "moeforge report: " + names : title;
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{0}</title>\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<style>\n{1}</style>\n</head>\n"
      "<body>\n<header><h1>{0}</h1><p>{2} run(s); written by moeforge {3}. Hover a chart for values; click a "
      "table header to sort.</p></header>\n<main id=\"panels\"></main>\n"
      "<script type=\"application/json\" id=\"report-data\">{4}</script>\n<script>\n{5}</script>\n</body>\n</html>\n",
      xml_escape(heading), kReportCss, runs.size(), MOEFORGE_VERSION, json, kReportJs);
}

void write_report(const std::vector<std::string>& run_dirs, const std::string& out, const std::string& title) {
  std::vector<nlohmann::json> runs;
  for (auto& d : run_dirs) runs.push_back(collect_report_run(d));
  write_file_atomic(out, report_html(runs, title));
}

}  // namespace mf
