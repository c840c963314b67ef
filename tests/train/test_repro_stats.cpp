// The reproductions' statistics against hand-computed values, the well-trained-arm rule, and
// every committed docs/repro/*/results.md against a fresh rendering of its results.json.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/util.h"
#include "train/repro_report.h"
#include "train/repro_stats.h"

using namespace mf;
namespace fs = std::filesystem;

TEST(ReproStats, StudentTQuantilesMatchTheTables) {
  // dof 1: tan(pi (p - 1/2)); dof 2: (2p - 1) / sqrt(2 p (1 - p)), closed forms
  EXPECT_NEAR(student_t_quantile(0.975, 1), std::tan(M_PI * 0.475), 1e-9);
  EXPECT_NEAR(student_t_quantile(0.975, 2), 0.95 / std::sqrt(2 * 0.975 * 0.025), 1e-9);  // n = 3: 4.302653
  EXPECT_NEAR(student_t_quantile(0.975, 2), 4.302653, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.975, 4), 2.776445, 1e-6);  // n = 5
  EXPECT_NEAR(student_t_quantile(0.975, 7), 2.364624, 1e-6);  // n = 8
  EXPECT_NEAR(student_t_quantile(0.975, 1000), 1.962339, 1e-6);
  EXPECT_NEAR(student_t_quantile(0.025, 4), -2.776445, 1e-6);
  EXPECT_NEAR(student_t_cdf(0, 3), 0.5, 1e-15);
  EXPECT_NEAR(student_t_cdf(2.776445, 4) + student_t_cdf(-2.776445, 4), 1, 1e-12);
}

TEST(ReproStats, PairedDifferenceAndOneVerdictOfEachKind) {
  // differences 0.10, 0.12, 0.11: mean 0.11, sd 0.01, se 0.01/sqrt(3), half-width 4.302653 se
  auto held = paired_difference({1.10, 1.22, 1.31}, {1.00, 1.10, 1.20});
  EXPECT_NEAR(held.mean, 0.11, 1e-12);
  EXPECT_NEAR(held.se, 0.01 / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(held.half_width(), 4.302653 * 0.01 / std::sqrt(3.0), 1e-7);
  EXPECT_EQ(held.call(true), "held");
  EXPECT_EQ(held.call(false), "did not hold");
  // differences 0.10, 0.20, 0.05: mean 0.11667, sd 0.076376, se 0.044096, half-width 0.18973 > mean
  auto unresolved = paired_difference({1.10, 1.20, 1.05}, {1.0, 1.0, 1.0});
  EXPECT_NEAR(unresolved.se, 0.0440959, 1e-6);
  EXPECT_NEAR(unresolved.half_width(), 0.189731, 1e-5);
  EXPECT_EQ(unresolved.call(true), "not resolved at this scale");
  // the old two-SE rule would have called this one: mean 2.65 se, inside 4.30 se
  EXPECT_GT(unresolved.mean, 2 * unresolved.se);
  EXPECT_EQ(paired_difference({1.0}, {0.5}).call(true), "not resolved (one seed)");
}

TEST(ReproStats, DirectionLineRecomputesTheVerdictAndShowsTheInterval) {
  Direction d{"A beats B (B - A)", true, true, PaperEffect{0.0288, "Table 5"}, " nats"};
  auto j = direction_json(d, paired_difference({1.10, 1.22, 1.31}, {1.00, 1.10, 1.20}));
  EXPECT_EQ(j["call"], "held");
  EXPECT_EQ(j["dof"], 2);
  const auto line = direction_line(j);
  EXPECT_NE(line.find("**[primary]** A beats B (B - A): +0.1100 nats (95 % CI +0.0852 to +0.1348, n = 3;"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("paper: +0.0288 nats (Table 5) → **held**"), std::string::npos) << line;
  j["call"] = "did not hold";  // a stale call in a file does not survive rendering
  EXPECT_NE(direction_line(j).find("→ **held**"), std::string::npos);
  EXPECT_NE(direction_line(j, "1 of 4 runs are not well trained").find("→ **no verdict** (1 of 4"), std::string::npos);
}

TEST(ReproStats, StillFallingRunsNeedTheSameVerdictAtEightyPercent) {
  Direction d{"A beats B (B - A)", true, true, std::nullopt, " nats"};
  const auto held = paired_difference({1.10, 1.22, 1.31}, {1.00, 1.10, 1.20});
  const auto unresolved = paired_difference({1.10, 1.20, 1.05}, {1.0, 1.0, 1.0});
  auto with_early = [&](const PairedDifference& final, const PairedDifference& early) {
    auto j = direction_json(d, final);
    const auto e = direction_json(d, early);
    j["early"] = {{"difference", e["difference"]}, {"se", e["se"]}, {"seeds", e["seeds"]}, {"dof", e["dof"]}};
    return j;
  };
  const auto same = direction_line(with_early(held, held), "", true);
  EXPECT_NE(same.find("; at 80 % of the steps: +0.1100 (95 % CI +0.0852 to +0.1348, n = 3)"), std::string::npos)
      << same;
  EXPECT_NE(same.find("→ **held** (already at 80 % of the steps)"), std::string::npos) << same;
  const auto formed_late = direction_line(with_early(held, unresolved), "", true);
  EXPECT_NE(formed_late.find("→ **no verdict** (held at the end but not resolved at this scale at 80 % of the steps"),
            std::string::npos)
      << formed_late;
  // no run still falling: the final call, the 80 % value only shown
  EXPECT_NE(direction_line(with_early(held, unresolved)).find("→ **held**\n"), std::string::npos);
  // "not resolved" claims nothing, so it needs no check
  EXPECT_NE(direction_line(with_early(unresolved, held), "", true).find("→ **not resolved at this scale**\n"),
            std::string::npos);
  EXPECT_NE(direction_line(direction_json(d, held), "", true).find("→ **no verdict** (runs still falling"),
            std::string::npos);
}

TEST(ReproResults, EarlyDirectionsComeFromTheHeldOutLossesAtEightyPercent) {
  nlohmann::json r = {{"arms",
                       {{"a", {{"val_loss", {1.1, 1.2, 1.3}}, {"val_loss_80", {1.5, 1.6, 1.8}}}},
                        {"b", {{"val_loss", {1.0, 1.1, 1.2}}, {"val_loss_80", {1.4, 1.5, 1.6}}}}}}};
  auto add = [](nlohmann::json& x) {
    const auto a = x["arms"]["a"]["val_loss"].get<std::vector<double>>();
    const auto b = x["arms"]["b"]["val_loss"].get<std::vector<double>>();
    x["directions"].push_back(direction_json({"b beats a", true, true, std::nullopt, ""}, paired_difference(a, b)));
    if (!x.value("early_pass", false))
      x["directions"].push_back(direction_json({"final only", true, false, std::nullopt, ""}, paired_difference(a, b)));
  };
  add_directions_with_early(r, add);
  ASSERT_EQ(r["directions"].size(), 2u);
  // early differences 0.1, 0.1, 0.2: mean 0.13333
  EXPECT_NEAR(r["directions"][0]["early"]["difference"].get<double>(), 0.4 / 3, 1e-12);
  EXPECT_EQ(r["directions"][0]["early"]["seeds"], 3);
  EXPECT_NEAR(r["directions"][0]["difference"].get<double>(), 0.1, 1e-12);
  EXPECT_FALSE(r["directions"][1].contains("early"));
  r["arms"]["b"]["val_loss_80"][1] = nullptr;  // a run that never evaluated by 80 %: no early values
  add_directions_with_early(r, add);
  EXPECT_FALSE(r["directions"][0].contains("early"));
}

// The verdict as a word, as direction_line shows it.
TEST(ReproStats, ShownCallFollowsTheWithheldAndEightyPercentRules) {
  auto d = direction_json({"x", true, true, std::nullopt, ""}, paired_difference({1.1, 1.2, 1.3}, {0, 0, 0}));
  EXPECT_EQ(shown_call(d), "held");
  EXPECT_EQ(shown_call(d, true), "no verdict");
  EXPECT_EQ(shown_call(d, false, true), "no verdict");  // still falling and no 80 % value
  d["early"] = {{"difference", -1.0}, {"se", 0.01}, {"seeds", 3}, {"dof", 2}};
  EXPECT_EQ(shown_call(d, false, true), "no verdict");  // 80 %: the other way
  d["early"]["difference"] = 1.0;
  EXPECT_EQ(shown_call(d, false, true), "held");
  auto unresolved = direction_json({"y", true, false, std::nullopt, ""}, paired_difference({1, -1, 0.5}, {0, 0, 0}));
  EXPECT_EQ(shown_call(unresolved, false, true), "not resolved at this scale");
}

// Every "X_80" of an arm stands in for its "X" in the early pass (a classifier's accuracy too).
TEST(ReproResults, EarlyPassSwapsEveryEightyPercentValue) {
  nlohmann::json r = {
      {"arms",
       {{"a",
         {{"val_loss", {1.0, 1.0}}, {"val_loss_80", {1.0, 1.0}}, {"accuracy", {80, 82}}, {"accuracy_80", {70, 71}}}},
        {"b",
         {{"val_loss", {1.0, 1.0}}, {"val_loss_80", {1.0, 1.0}}, {"accuracy", {79, 80}}, {"accuracy_80", {70, 70}}}}}}};
  auto add = [](nlohmann::json& x) {
    x["directions"].push_back(direction_json({"a beats b", true, true, std::nullopt, ""},
                                             paired_difference(x["arms"]["a"]["accuracy"].get<std::vector<double>>(),
                                                               x["arms"]["b"]["accuracy"].get<std::vector<double>>())));
  };
  add_directions_with_early(r, add);
  EXPECT_NEAR(r["directions"][0]["difference"].get<double>(), 1.5, 1e-12);
  EXPECT_NEAR(r["directions"][0]["early"]["difference"].get<double>(), 0.5, 1e-12);
  r["arms"]["a"]["accuracy_80"][0] = nullptr;
  add_directions_with_early(r, add);
  EXPECT_FALSE(r["directions"][0].contains("early"));
}

TEST(ReproStats, LeastSquaresCoefficientAndItsStandardError) {
  // y on (1, x) through (0, 0), (1, 1), (2, 1): b = 1/2, a = 1/6, RSS = 1/6 on 1 dof, se(b) = sqrt(1/12)
  const auto fit = least_squares({{1, 0}, {1, 1}, {1, 2}}, {0, 1, 1});
  EXPECT_NEAR(fit.coef[0], 1.0 / 6, 1e-12);
  EXPECT_NEAR(fit.coef[1], 0.5, 1e-12);
  EXPECT_NEAR(fit.se[1], std::sqrt(1.0 / 12), 1e-12);
  EXPECT_EQ(fit.dof, 1);
  EXPECT_NEAR(fit.half_width(1), std::tan(M_PI * 0.475) * std::sqrt(1.0 / 12), 1e-9);
  // an exact quadratic recovers its coefficients with zero error
  std::vector<std::vector<double>> X;
  std::vector<double> y;
  for (double x : {-2.0, -1.0, 0.0, 1.0, 2.0, 3.0}) X.push_back({1, x, x * x}), y.push_back(4 - x + 0.5 * x * x);
  const auto q = least_squares(X, y);
  EXPECT_NEAR(q.coef[2], 0.5, 1e-10);
  EXPECT_NEAR(q.se[2], 0, 1e-6);
  EXPECT_THROW(least_squares({{1, 1}, {1, 1}, {1, 1}}, {1, 2, 3}), std::invalid_argument);
}

namespace {

// A run directory with a summary and a training curve loss(step) over 100 steps.
std::string fake_run(const std::string& name, double val, const std::function<double(double)>& loss) {
  const auto dir = (fs::temp_directory_path() / ("mf_health_" + name)).string();
  fs::create_directories(dir);
  write_file_atomic(dir + "/summary.json",
                    nlohmann::json{{"val_loss_mean", val}, {"unigram_entropy_nats", 6.0}, {"steps", 100}}.dump());
  std::string m;
  for (int s = 10; s <= 100; s += 10) m += nlohmann::json{{"step", s}, {"loss", loss(s)}}.dump() + "\n";
  write_file_atomic(dir + "/metrics.jsonl", m);
  return dir;
}

}  // namespace

TEST(ReproStats, TrainingHealthNeedsDistanceFromThePlateauAndAFlatTail) {
  EXPECT_EQ(training_health(fake_run("good", 5.0, [](double) { return 5.0; })).problem, "");
  const auto plateau = training_health(fake_run("plateau", 5.7, [](double) { return 5.7; }));
  EXPECT_NE(plateau.problem.find("less than 0.5 below the unigram entropy"), std::string::npos) << plateau.problem;
  // 5.5 at step 80 falling 0.01 a step: 0.2 nats over the last 20 steps, ~3.8 % of the mean 5.4
  const auto falling = training_health(fake_run("falling", 5.0, [](double s) { return 6.3 - 0.01 * s; }));
  EXPECT_NEAR(falling.late_fall, 0.2 / 5.4, 1e-9);
  EXPECT_NE(falling.problem.find("still fell 3.7 %"), std::string::npos) << falling.problem;
  EXPECT_EQ(falling.kind, "falling");
  EXPECT_EQ(plateau.kind, "plateau");
  // with 3 validation losses in the last 20 %, those decide (flat here), not the falling batch losses
  const auto dir = fake_run("validated", 5.0, [](double s) { return 6.3 - 0.01 * s; });
  std::string m = read_file(dir + "/metrics.jsonl");
  for (int s : {80, 90, 100}) m += nlohmann::json{{"step", s}, {"val_loss_mean", 5.0}}.dump() + "\n";
  write_file_atomic(dir + "/metrics.jsonl", m);
  const auto validated = training_health(dir);
  EXPECT_NEAR(validated.late_fall, 0, 1e-12);
  EXPECT_EQ(validated.problem, "");
}

TEST(ReproStats, HeldOutLossAtAFractionIsTheLastEvaluationBeforeIt) {
  const auto dir = fake_run("fraction", 5.0, [](double) { return 5.0; });
  std::string m = read_file(dir + "/metrics.jsonl");
  for (int s : {40, 80, 100}) m += nlohmann::json{{"step", s}, {"val_loss_mean", 6.0 - s / 100.0}}.dump() + "\n";
  write_file_atomic(dir + "/metrics.jsonl", m);
  EXPECT_DOUBLE_EQ(held_out_loss_at(dir, 0.8), 5.2);   // the evaluation at step 80
  EXPECT_DOUBLE_EQ(held_out_loss_at(dir, 0.79), 5.6);  // step 40: the last one before step 79
  EXPECT_DOUBLE_EQ(held_out_loss_at(dir, 1.0), 5.0);
  EXPECT_TRUE(std::isnan(held_out_loss_at(dir, 0.3)));
}

// Every committed results file of the current format regenerates byte for byte (results.md and
// the pictures its renderer writes); older ones are listed by the test below.
TEST(ReproResults, CommittedResultsRegenerateByteForByte) {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "ctest sets MOEFORGE_SOURCE_DIR";
  int checked = 0;
  for (const auto& dir : fs::directory_iterator(fs::path(src) / "docs/repro")) {
    const auto json = dir.path() / "results.json";
    if (!fs::exists(json)) continue;
    const auto results = nlohmann::json::parse(read_file(json.string()));
    if (results.value("format", 0) != kReproFormat) continue;
    const auto out = fs::temp_directory_path() / ("mf_regen_" + dir.path().filename().string());
    fs::remove_all(out);
    fs::create_directories(out);
    const auto md = render_results(results, out.string());
    EXPECT_TRUE(md == read_file((dir.path() / "results.md").string()))
        << dir.path() << "/results.md differs from the rendering of its results.json: edited by hand or stale "
        << "(moeforge repro " << results["repro"].get<std::string>() << " --report-only --out " << dir.path() << ")";
    for (const auto& pic : fs::directory_iterator(out))
      EXPECT_TRUE(read_file(pic.path().string()) == read_file((dir.path() / pic.path().filename()).string()))
          << dir.path() / pic.path().filename() << " differs from its rendering";
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no committed results file of format " << kReproFormat << " yet";
}

TEST(ReproResults, EveryCommittedResultsFileIsRenderedFromItsJson) {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  std::vector<std::string> older;
  for (const auto& dir : fs::directory_iterator(fs::path(src) / "docs/repro")) {
    const auto json = dir.path() / "results.json";
    ASSERT_TRUE(fs::exists(json)) << dir.path() << " has no results.json";
    if (nlohmann::json::parse(read_file(json.string())).value("format", 0) != kReproFormat)
      older.push_back(dir.path().filename().string());
  }
  if (!older.empty()) {
    std::string list;
    for (const auto& o : older) list += " " + o;
    GTEST_SKIP() << older.size() << " committed results predate rendering from results.json and cannot be "
                 << "regenerated until their reproductions run again:" << list;
  }
}
