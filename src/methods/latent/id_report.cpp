#include "methods/latent/id_report.h"

#include <filesystem>

#include "analysis/svg_plot.h"
#include "core/util.h"
#include "io/checkpoint.h"
#include "io/model_io.h"

namespace mf {

IdReport write_id_report(const IdRequest& r) {
  auto l = load_model(r.checkpoint);
  PreparedCorpus corpus(r.data_dir.empty() ? l.cfg.data.dir : r.data_dir);
  IdReport out;
  out.profile = intrinsic_dimension_profile(l.model, corpus, "val", l.cfg.train.seq_len, r.collect, r.keep, r.seed);
  out.prefix = r.prefix.empty() ? (std::filesystem::path(read_checkpoint(r.checkpoint).dir) / "id").string() : r.prefix;
  const auto& id = out.profile.id;
  Series s{"TwoNN intrinsic dimension", {}, id};
  for (size_t i = 0; i < id.size(); ++i) s.x.push_back(static_cast<double>(i));
  write_file_atomic(out.prefix + ".svg", line_chart_svg({s}, {"intrinsic dimension per block — " + l.cfg.run.name,
                                                              "block (output of)", "TwoNN ID"}));
  out.split = two_segment_split(id);
  nlohmann::json j = {{"id", id},
                      {"tokens_collected", out.profile.tokens_collected},
                      {"tokens_used", out.profile.tokens_used},
                      {"two_segment_split", out.split}};
  if (out.split > 0 && r.reference && r.narrow > 0 && r.wide > 0) {
    out.allocation = two_segment(l.cfg, out.split, *r.reference, r.narrow, r.wide, r.multiple);
    const auto& t = *out.allocation;
    write_file_atomic(out.prefix + "_allocation.toml", to_toml(t.config));
    j["allocation"] = {
        {"latent", t.shapes()}, {"narrow_deviation", t.narrow.deviations()}, {"wide_deviation", t.wide.deviations()}};
  }
  write_file_atomic(out.prefix + ".json", j.dump(2) + "\n");
  return out;
}

}  // namespace mf
