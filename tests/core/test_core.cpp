// Config schema/validation and core utilities.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/config.h"
#include "core/exp_poly.h"
#include "core/runtime.h"
#include "core/timing.h"
#include "core/util.h"

using namespace mf;

static std::string config_error(const std::string& toml) {
  Config c;
  try {
    apply_toml_text(c, toml, "test.toml");
    validate(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsAreValid) { EXPECT_NO_THROW(validate(Config{})); }

// Benchmarks' rounds: every fn once per round after the untimed ones, round r starting at fn r mod n;
// ratios as the median of same-round ratios (hand-computed)
TEST(Timing, RoundsInTurnsAndTheMedianOfSameRoundRatios) {
  std::vector<int> calls;
  std::vector<std::function<void()>> fns;
  for (int i = 0; i < 3; ++i) fns.push_back([&calls, i] { calls.push_back(i); });
  const auto t = round_seconds(2, fns, 1);
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 2, 0, 1, 2, 1, 2, 0}));  // untimed, round 0, round 1
  ASSERT_EQ(t.size(), 3u);
  for (const auto& each : t) {
    ASSERT_EQ(each.size(), 2u);
    for (double s : each) EXPECT_GE(s, 0);
  }
  calls.clear();
  round_seconds(1, fns, 1, 1);  // a settling call before each timed one, not in the untimed round
  EXPECT_EQ(calls, (std::vector<int>{0, 1, 2, 0, 0, 1, 1, 2, 2}));
  EXPECT_DOUBLE_EQ(median_ratio({2, 4, 6}, {1, 1, 2}), 3.0);  // ratios 2, 4, 3
  EXPECT_DOUBLE_EQ(median_ratio({1, 2, 9}, {1, 1}), 1.5);     // the rounds both have
  EXPECT_TRUE(std::isnan(median_ratio({}, {1})));
  EXPECT_DOUBLE_EQ(median({5, 1, 3}), 3.0);
  EXPECT_DOUBLE_EQ(median({4, 1}), 2.5);
}

TEST(Config, AppliesValues) {
  Config c;
  apply_toml_text(c, "[train]\nlr = 1e-3\nsteps = 7\n[model]\nscale_out_init = false\nffn = \"swiglu\"", "t");
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_FALSE(c.model.scale_out_init);
}

TEST(Config, IntegerAcceptedForFloatKey) {
  Config c;
  apply_toml_text(c, "[train]\nlr = 1", "t");
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);
}

TEST(Config, UnknownKeyNamesPathAndSuggestion) {
  auto e = config_error("[train]\nlearning_rat = 0.1");
  EXPECT_NE(e.find("train.learning_rat"), std::string::npos) << e;
  e = config_error("[train]\nstep = 5");
  EXPECT_NE(e.find("did you mean 'train.steps'"), std::string::npos) << e;
  e = config_error("[modle]\nd_model = 64");
  EXPECT_NE(e.find("modle.d_model"), std::string::npos) << e;
  EXPECT_NE(e.find("model.d_model"), std::string::npos) << e;
}

TEST(Config, WrongTypeNamesKeyAndType) {
  auto e = config_error("[train]\nsteps = \"many\"");
  EXPECT_NE(e.find("train.steps"), std::string::npos) << e;
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
  e = config_error("[train]\nsteps = 1.5");
  EXPECT_NE(e.find("integer"), std::string::npos) << e;
}

TEST(Config, OutOfRangeNamesRange) {
  auto e = config_error("[train]\nbeta2 = 1.5");
  EXPECT_NE(e.find("train.beta2"), std::string::npos) << e;
  EXPECT_NE(e.find("[0, 1]"), std::string::npos) << e;
  e = config_error("[model]\nffn = \"mixture\"");
  EXPECT_NE(e.find("model.ffn"), std::string::npos) << e;
  EXPECT_NE(e.find("swiglu, gelu, moe"), std::string::npos) << e;
  e = config_error("[model.moe]\nrouter = \"softmax\"");
  EXPECT_NE(e.find("one of {softmax_topk, sigmoid_topk, norm_topk, top_p, uniform_random, balanced}"),
            std::string::npos)
      << e;
}

TEST(Config, SyntaxErrorHasLocation) {
  auto e = config_error("[train\nlr = 1");
  EXPECT_NE(e.find("test.toml:1"), std::string::npos) << e;
}

TEST(Config, CrossFieldChecks) {
  EXPECT_NE(config_error("[model]\nn_heads = 8\nn_kv_heads = 3").find("n_kv_heads"), std::string::npos);
  EXPECT_NE(config_error("[model]\nd_model = 100\nn_heads = 8").find("divisible"), std::string::npos);
  EXPECT_NE(config_error("[train]\nseq_len = 4096").find("max_seq_len"), std::string::npos);
}

TEST(Config, OverridesUseTheSameValidation) {
  Config c;
  apply_override(c, "train.lr=0.5");
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  apply_override(c, "run.name=my-run");
  EXPECT_EQ(c.run.name, "my-run");
  apply_override(c, "model.moe.layers=1");  // string key: taken literally, not as an integer
  EXPECT_EQ(c.model.moe.layers, "1");
  apply_override(c, "model.moe.layers=1,3");
  EXPECT_EQ(c.model.moe.layers, "1,3");
  apply_override(c, "model.scale_out_init=false");
  EXPECT_FALSE(c.model.scale_out_init);
  EXPECT_THROW(apply_override(c, "train.lrr=0.5"), ConfigError);
  EXPECT_THROW(apply_override(c, "train.steps=abc"), ConfigError);
  EXPECT_THROW(apply_override(c, "train.steps=-1"), ConfigError);
  EXPECT_THROW(apply_override(c, "novalue"), ConfigError);
}

// Values that validate by range but cannot work are refused up front, naming the key;
// --set never half-applies a value.
TEST(Config, UnworkableValuesAreRejected) {
  EXPECT_NE(config_error("[sample]\ntop_p = 0").find("sample.top_p"), std::string::npos);
  EXPECT_NE(config_error("[sample]\ntemperature = 1e-9").find("sample.temperature"), std::string::npos);
  EXPECT_NE(config_error("[model]\nffn = \"moe\"\nn_layers = 2\n[model.moe]\nlayers = \"5\"").find("selects none"),
            std::string::npos);
  EXPECT_NE(config_error("[eval]\nwindows = 5000000").find("eval.windows"), std::string::npos);
  Config c;
  EXPECT_THROW(apply_override(c, "train.steps=5\ntrain.lr=9"), ConfigError);
  EXPECT_THROW(apply_override(c, "run.name=a\xff"), ConfigError);
  EXPECT_EQ(c.train.steps, Config{}.train.steps);
  EXPECT_EQ(c.run.name, Config{}.run.name);
}

TEST(Util, WholeIntegersUtf8AndJsonDepth) {
  EXPECT_EQ(parse_int("-12", "x"), -12);
  for (const char* bad : {"12x", "", " 1", "1.5", "99999999999999999999"})
    EXPECT_THROW(parse_int(bad, "x"), std::invalid_argument) << bad;
  EXPECT_EQ(parse_index_list("1,3,0", "x"), (std::vector<int64_t>{1, 3, 0}));
  for (const char* bad : {"", "1,", ",1", "1,,3", "1,-2", "a", "1, 3"})
    EXPECT_THROW(parse_index_list(bad, "x"), std::invalid_argument) << bad;
  try {
    parse_index_list("2,-1", "data.classes");
    ADD_FAILURE() << "a negative index was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("data.classes: '-1'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(json_depth(R"({"a": [1, {"b": "[[[[\"{"}], "c": {}})"), 3u);
  EXPECT_EQ(invalid_utf8_at("ok\xC3\xA9\xC3("), 4u);
  EXPECT_EQ(invalid_utf8_at("\xED\xA0\x80"), 0u);  // a surrogate
  EXPECT_EQ(invalid_utf8_at("\xF0\x9F\x91\x8D"), std::string_view::npos);
}

TEST(Config, ImageClassesAreAllOrAListOfExistingClasses) {
  Config c;
  c.model.task = "classify";
  c.model.n_kv_heads = c.model.n_heads;
  EXPECT_TRUE(image_classes(c.data).empty());
  apply_override(c, "data.classes=0,2,4,6");  // a string key takes the text as written
  EXPECT_EQ(image_classes(c.data), (std::vector<int64_t>{0, 2, 4, 6}));
  validate(c);
  c.data.classes = "1,10";
  EXPECT_THROW(validate(c), ConfigError);  // model.num_classes is 10
  c.data.classes = "none";
  try {
    image_classes(c.data);
    ADD_FAILURE() << "'none' was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.classes"), std::string::npos) << e.what();
  }
}

TEST(Config, TomlRoundTrip) {
  Config a;
  a.train.lr = 1.25e-4;
  a.sample.prompt = "quote \" and\nnewline";
  a.model.n_layers = 7;
  Config b;
  apply_toml_text(b, to_toml(a), "roundtrip");
  EXPECT_EQ(to_toml(a), to_toml(b));
  EXPECT_EQ(b.sample.prompt, a.sample.prompt);
  EXPECT_DOUBLE_EQ(b.train.lr, 1.25e-4);
}

TEST(Config, MarkdownListsEveryKey) {
  auto md = schema_markdown();
  for (auto& k : config_schema()) EXPECT_NE(md.find("`" + k.path + "`"), std::string::npos) << k.path;
}

TEST(Config, ShippedConfigsLoad) {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  if (!src) GTEST_SKIP() << "MOEFORGE_SOURCE_DIR not set";
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(std::string(src) + "/configs")) {
    EXPECT_NO_THROW(load_config(e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GT(n, 0);
}

TEST(Util, Fnv1aKnownValues) {
  EXPECT_EQ(fnv1a64("", 0), 0xcbf29ce484222325ULL);
  EXPECT_EQ(fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
}

TEST(Util, SplitMixIsDeterministicAndSeedSensitive) {
  SplitMix64 a(1), b(1), c(2);
  for (int i = 0; i < 5; ++i) {
    auto x = a.next();
    EXPECT_EQ(x, b.next());
    EXPECT_NE(x, c.next());
  }
  EXPECT_EQ(SplitMix64(0).next(), 0xe220a8397b1dcdafULL);  // reference value of SplitMix64
  EXPECT_NE(mix_seed(1, 2, 3), mix_seed(1, 3, 2));
}

TEST(Util, AtomicWriteReplacesWhole) {
  auto dir = std::filesystem::temp_directory_path() / "mf_util_test";
  std::filesystem::create_directories(dir);
  auto p = (dir / "f.txt").string();
  write_file_atomic(p, "first version");
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << "temp file left behind";
  std::filesystem::remove_all(dir);
}

TEST(Runtime, OpenBlasKernelsFollowTheInstructionSets) {
  EXPECT_EQ(openblas_coretype(true, true), "SkylakeX");
  EXPECT_EQ(openblas_coretype(false, true), "Haswell");
  EXPECT_EQ(openblas_coretype(false, false), "");  // OpenBLAS's own detection stands
}

TEST(Runtime, ThreadsPerWorkerShareTheCoresUnlessRequested) {
  EXPECT_EQ(threads_per_worker(0, 2, 1), 2);  // one process takes every core
  EXPECT_EQ(threads_per_worker(0, 2, 2), 1);  // `launch --nproc 2`: one each
  EXPECT_EQ(threads_per_worker(0, 2, 4), 1);  // more workers than cores: still one
  EXPECT_EQ(threads_per_worker(0, 16, 3), 5);
  EXPECT_EQ(threads_per_worker(3, 2, 1), 2);  // capped at the cores
  EXPECT_EQ(threads_per_worker(1, 16, 2), 1);
}

TEST(Util, FormatDuration) {
  EXPECT_EQ(format_duration(83), "01:23");
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(-1), "--:--");
}

#include "analysis/svg_plot.h"

TEST(SvgPlot, OnePolylinePerSeriesAndEscapedText) {
  std::vector<Series> s = {{"train <loss>", {0, 1, 2}, {3, 2, 1}}, {"val", {0, 2}, {3.5, std::nan("")}, true}};
  auto svg = line_chart_svg(s, {"a & b", "step", "loss"});
  size_t n = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1)) ++n;
  EXPECT_EQ(n, 2u);
  EXPECT_NE(svg.find("train &lt;loss&gt;"), std::string::npos);
  EXPECT_NE(svg.find("a &amp; b"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);
  EXPECT_NO_THROW(line_chart_svg({{"flat", {5}, {1}}}, {}));  // degenerate ranges
}

// logistic_denominator clamps in one test what exp_lanes clamps in two: the same numbers, bit for
// bit, at the clamps, past them, at the infinities and for NaN (the kernels built on them are checked
// against float64 at every SIMD level in the activation and decode tests)
TEST(ExpPoly, LogisticDenominatorIsOnePlusExpLanesBitForBit) {
  EXPECT_EQ(logistic_denominator(0.0f), 2.0f);  // e^0 = 1: n = 0, r = 0
  const auto bits = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  std::vector<float> g = {0.0f, -0.0f, 0.5f, -0.5f, 1.0f, INFINITY, -INFINITY, 1e30f, -1e30f};
  for (float edge : {87.0f, 88.0f})
    for (float v : {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, 1e9f)}) g.insert(g.end(), {v, -v});
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  for (int i = 0; i < 100000; ++i) g.push_back(wide(rng));
  for (float v : g) EXPECT_EQ(bits(logistic_denominator(v)), bits(1.0f + exp_lanes(-v))) << "g = " << v;
  EXPECT_TRUE(std::isnan(logistic_denominator(NAN)));
  EXPECT_EQ(logistic_denominator(-200.0f), 1.0f + exp_lanes(88.0f));  // e^200 clamped to e^88
  EXPECT_EQ(logistic_denominator(200.0f), 1.0f);                      // e^-87 vanishes beside 1
  EXPECT_NEAR(logistic_denominator(-3.0f), 1.0 + std::exp(3.0), 1e-6 * std::exp(3.0));
}
