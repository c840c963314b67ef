// The run report's data (analysis/report): what it reads from a run directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "analysis/report.h"
#include "core/util.h"

namespace fs = std::filesystem;

namespace mf {
namespace {

nlohmann::json layer_record(int64_t layer, int64_t step) {
  return {{"layer", layer},     {"load", {3, 0, 5}}, {"cv", 0.5},        {"max_over_mean", 1.9},    {"dead", 1},
          {"entropy", 0.9},     {"aux", 0.01},       {"z", 1e-3 * step}, {"units_per_token", 10.5}, {"b_mean", 2.5},
          {"b_hist", {0, 4, 4}}};
}

fs::path fake_run(const std::string& name) {
  auto dir = fs::temp_directory_path() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  // "</script>" in the config must not end the page's data block
  write_file_atomic((dir / "config.toml").string(),
                    "# a comment with </script> in it\n[model]\nffn = \"moe\"\nmoe.unif.blocks = 4\n"
                    "[train]\nsteps = 100\n[run]\nname = \"toy\"\n");
  std::string lines;
  for (int64_t step = 1; step <= 10; ++step) {
    nlohmann::json r = {{"step", step * 5}, {"loss", 3.0 - 0.1 * static_cast<double>(step)},     {"lr", 1e-3},
                        {"grad_norm", 1.0}, {"tokens_per_s", 100.0 * static_cast<double>(step)}, {"elapsed_s", step}};
    r["moe"] = {layer_record(1, step), layer_record(3, step)};
    lines += r.dump() + "\n";
    if (step % 5 == 0)
      lines +=
          nlohmann::json({{"step", step * 5}, {"val_loss", {{"a", 2.0}, {"b", 2.5}}}, {"val_loss_mean", 2.25}}).dump() +
          "\n";
  }
  write_file_atomic((dir / "metrics.jsonl").string(), lines + "{\"step\": 55, \"loss\"");  // cut short by a kill
  write_file_atomic((dir / "usage_heatmap.svg").string(), "<?xml version=\"1.0\"?>\n<svg><rect/></svg>\n");
  return dir;
}

TEST(Report, ReadsARunThatIsStillTraining) {
  const auto dir = fake_run("mf_report_test");
  auto r = collect_report_run(dir.string(), /*max_points=*/4);
  EXPECT_EQ(r["name"], "toy");
  EXPECT_EQ(r["method"], "UniF-MoE");
  EXPECT_EQ(r["items"], "tokens");
  // 10 records, at most 4 points: every third (steps 5, 20, 35) and the last (50)
  EXPECT_EQ(r["train"]["step"], nlohmann::json({5, 20, 35, 50}));
  EXPECT_EQ(r["moe_steps"], nlohmann::json({5, 20, 35, 50}));
  EXPECT_EQ(r["val"]["step"], nlohmann::json({25, 50}));
  EXPECT_EQ(r["val"]["losses"]["b"], nlohmann::json({2.5, 2.5}));
  EXPECT_EQ(r["step"], 50);
  EXPECT_EQ(r["status"], "step 50 of 100 (training or stopped)");
  EXPECT_DOUBLE_EQ(r["throughput"].get<double>(), 1000.0);
  ASSERT_EQ(r["moe"].size(), 2u);
  const auto& L = r["moe"][1];
  EXPECT_EQ(L["layer"], 3);
  EXPECT_EQ(L["load"], nlohmann::json({3, 0, 5}));
  EXPECT_EQ(L["loss_keys"], nlohmann::json({"aux", "z"}));  // not cv, dead, max_over_mean, ...
  EXPECT_EQ(L["count_keys"], nlohmann::json({"b_mean"}));
  EXPECT_EQ(L["hist"]["b"], nlohmann::json({0, 4, 4}));
  EXPECT_NEAR(L["series"]["z"][3].get<double>(), 0.010, 1e-12);
  ASSERT_EQ(r["artifacts"].size(), 1u);
  EXPECT_EQ(r["artifacts"][0]["svg"], "<svg><rect/></svg>\n");  // without the XML prolog

  const auto html = report_html({r}, "");
  size_t ends = 0;
  for (size_t at = 0; (at = html.find("</script>", at)) != std::string::npos; ++at) ++ends;
  EXPECT_EQ(ends, 2u) << "the data block and the script, nothing inside them";
  EXPECT_NE(html.find("<title>moeforge report: toy</title>"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg")) << "no address but the SVG namespace";

  write_file_atomic((dir / "summary.json").string(), R"({"finished": true, "steps": 50, "elapsed_s": 9.5})");
  EXPECT_EQ(collect_report_run(dir.string())["status"], "finished");
  EXPECT_DOUBLE_EQ(collect_report_run(dir.string())["elapsed"].get<double>(), 9.5);
  fs::remove_all(dir);
}

// The method comes from the methods' own registrations (model/method_info.h).
TEST(Report, NamesTheMethodsTheConfigEnables) {
  const auto method_of = [](const std::string& config) {
    const auto dir = fs::temp_directory_path() / "mf_report_method";
    fs::remove_all(dir);
    fs::create_directories(dir);
    write_file_atomic((dir / "config.toml").string(), config);
    return collect_report_run(dir.string(), 4);
  };
  auto r = method_of("[model]\nffn = \"moe\"\nmoe.unipool.groups = 1\nmoe.latent.shapes = \"32,64,4,2,0\"\n");
  EXPECT_EQ(r["method"], "LatentMoE + UniPool");         // registration order
  EXPECT_EQ(r["method_panel"], "UniPool pool routing");  // the pooled method leads
  EXPECT_TRUE(r["pooled"].get<bool>());
  EXPECT_EQ(r["facts"]["model.moe.latent.shapes"], "32,64,4,2,0");
  EXPECT_EQ(r["facts"]["model.moe.unipool.groups"], 1);
  r = method_of("[model]\nffn = \"intb\"\n");
  EXPECT_EQ(r["method"], "IntBMoE");
  r = method_of("[model]\nffn = \"moe\"\n");
  EXPECT_EQ(r["method"], "top-k MoE");
  EXPECT_EQ(r["method_panel"], "Routing");
  r = method_of("[model]\nffn = \"gelu\"\n");
  EXPECT_EQ(r["method"], "dense gelu");
  r = method_of("[model]\nffn = \"moe\"\nmoe.no_such_key = 1\n");  // not loadable: said, not guessed
  EXPECT_NE(r["method_note"].get<std::string>().find("model.moe.no_such_key"), std::string::npos) << r["method_note"];
}

TEST(Report, RefusesADirectoryThatIsNotARun) {
  const auto dir = fs::temp_directory_path() / "mf_report_not_a_run";
  fs::create_directories(dir);
  try {
    collect_report_run(dir.string());
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mf_report_not_a_run' is not a run directory"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mf
