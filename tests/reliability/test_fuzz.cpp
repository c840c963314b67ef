// Structure-aware fuzzing of what users hand us: safetensors files (loaded into a model),
// TOML configs and --set strings. Each case ends in one of: success, a clear error (the
// reader's own error type, which names the file or key), an unclear error (any other
// exception), a hang (> 2 s for one case); a crash ends the process. Only the first two may
// occur. MOEFORGE_FUZZ_CASES sets the cases per target (default 1,000) and MOEFORGE_FUZZ_SEED
// the seed (scripts/stress.sh runs many more cases and seeds, under AddressSanitizer/UBSan
// when asked).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/util.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "model/transformer.h"
#include "reliability/fuzz.h"
#include "test_support.h"

using namespace mf;
using namespace mf::fuzz;
using json = nlohmann::json;

TEST(Fuzz, SafetensorsFilesLoadIntoAModelOrFailClearly) {
  const Config cfg = [] {
    Config c;
    c.model = test::small_moe(64, 16, 1, 4, 2, 16);
    c.model.n_heads = 2;
    c.model.n_kv_heads = 1;
    return c;
  }();
  TransformerLM model(cfg.model);
  const auto seed = serialize_safetensors(model_tensors(*model), {{"moeforge.config", to_toml(cfg)}});
  const auto dir = (std::filesystem::temp_directory_path() / fmt::format("mf_fuzz_{}", ::getpid())).string();
  std::filesystem::create_directories(dir);
  const auto path = dir + "/model.safetensors";
  const auto o = run_cases<FormatError>(
      "safetensors", cases(), [&](SplitMix64& rng) { return mutate_safetensors(seed, rng); },
      [&](const std::string& bytes) {
        write_file_atomic(path, bytes);
        const SafetensorsShards file(dir, "model");  // streamed reader, then the whole-file parser
        load_module_tensors(*model, file, "");
        load_model_tensors(*model, parse_safetensors(bytes, path));
      });
  std::filesystem::remove_all(dir);
  expect_only_success_or_clear(o);
}

TEST(Fuzz, ConfigsAndSetStringsAreAcceptedOrRefusedByKey) {
  const auto seed =
      read_file(std::string(std::getenv("MOEFORGE_SOURCE_DIR") ? std::getenv("MOEFORGE_SOURCE_DIR") : ".") +
                "/configs/quickstart.toml");
  const auto toml = run_cases<ConfigError>(
      "toml", cases(),
      [&](SplitMix64& rng) {
        std::string t = seed;
        switch (rng.below(5)) {
          case 0:
            for (int k = 0; k < 1 + static_cast<int>(rng.below(4)); ++k)
              t[rng.below(t.size())] ^= static_cast<char>(1 << rng.below(8));
            return t;
          case 1: return t.substr(0, rng.below(t.size()));
          case 2:
            return t + "\nx = " + std::string(rng.below(300), '[') + "1" + std::string(rng.below(300), ']') + "\n";
          case 3: return t + "\n" + random_bytes(rng, rng.below(40)) + "\n";
          default: {  // a real key with a weird value, appended in its own table
            const auto& keys = config_schema();
            const auto& key = keys[rng.below(keys.size())].path;
            const auto dot = key.rfind('.');
            const std::vector<std::string> values = {"-1",   "1e309",  "nan",     "inf",
                                                     "\"\"", "[1, 2]", "{a = 1}", "99999999999999999999",
                                                     "0",    "1.5",    "true",    "\"x\\ny\""};
            return "[" + key.substr(0, dot) + "]\n" + key.substr(dot + 1) + " = " + values[rng.below(values.size())] +
                   "\n";
          }
        }
      },
      [](const std::string& text) {
        Config c;
        apply_toml_text(c, text, "fuzz.toml");
        validate(c);
      });
  expect_only_success_or_clear(toml);
  const auto sets = run_cases<ConfigError>(
      "--set", cases(),
      [](SplitMix64& rng) {
        const auto& keys = config_schema();
        const std::vector<std::string> values = {"-1",
                                                 "1e309",
                                                 "nan",
                                                 "inf",
                                                 "1\nmodel.d_model=8",
                                                 "a\xff",
                                                 "[1,2",
                                                 "",
                                                 "0x10",
                                                 "1_000",
                                                 "99999999999999999999",
                                                 "true",
                                                 "1.5",
                                                 "\"quoted\"",
                                                 "1,3,99",
                                                 std::string(5000, '9')};
        return keys[rng.below(keys.size())].path + "=" + values[rng.below(values.size())];
      },
      [](const std::string& assignment) {
        Config c;
        apply_override(c, assignment);
        validate(c);
      });
  expect_only_success_or_clear(sets);
}
