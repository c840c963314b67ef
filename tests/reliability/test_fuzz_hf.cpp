// Fuzzing `moeforge import` with Hugging Face directories as a hostile user edits them: the
// tiny Qwen3-MoE of tests/io/hf_reference.py (two shards and an index) with one of config.json,
// the index or a shard mutated per case. Every case must import or end in a FormatError /
// ConfigError (both name the file and key; exit 3); MOEFORGE_FUZZ_CASES / 10 cases.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/config.h"
#include "io/hf/hf_dir.h"
#include "io/safetensors.h"
#include "reliability/fuzz.h"

using namespace mf;
using namespace mf::fuzz;
namespace fs = std::filesystem;

namespace {

struct ClearImport : std::runtime_error {
  using std::runtime_error::runtime_error;
};

json hostile_number(SplitMix64& rng) {
  switch (rng.below(8)) {
    case 0: return 0;
    case 1: return -1;
    case 2: return 2147483648LL;
    case 3: return 1e308;
    case 4: return 1e-300;
    case 5: return 3;  // divides little
    case 6: return 1000000;
    default: return 0.5;
  }
}

std::string mutate_config(const std::string& pristine, SplitMix64& rng) {
  auto c = json::parse(pristine);
  std::vector<std::string> keys;
  for (auto& [k, v] : c.items()) keys.push_back(k);
  const auto key = keys[rng.below(keys.size())];
  switch (rng.below(6)) {
    case 0: c[key] = hostile_number(rng); break;
    case 1: c[key] = weird_value(rng); break;
    case 2: c.erase(key); break;
    case 3:
      c[std::vector<std::string>{"rope_scaling", "mlp_only_layers", "sliding_window", "tie_word_embeddings",
                                 "decoder_sparse_step", "head_dim"}[rng.below(6)]] = weird_value(rng);
      break;
    case 4: return flip_or_cut(c.dump(), rng);
    default: c["model_type"] = weird_value(rng); break;
  }
  return c.dump(-1, ' ', false, json::error_handler_t::ignore);
}

std::string mutate_index(const std::string& pristine, SplitMix64& rng) {
  auto idx = json::parse(pristine);
  auto& map = idx["weight_map"];
  std::vector<std::string> names;
  for (auto& [k, v] : map.items()) names.push_back(k);
  const auto name = names[rng.below(names.size())];
  switch (rng.below(5)) {
    case 0: map.erase(name); break;
    case 1: map[name] = rng.below(2) ? json("model-00009-of-00002.safetensors") : json("../../etc/passwd"); break;
    case 2: map[name] = weird_value(rng); break;
    case 3: idx["metadata"]["total_size"] = weird_value(rng); break;
    default: return flip_or_cut(idx.dump(), rng);
  }
  return idx.dump();
}

TEST(Fuzz, HuggingFaceDirectoriesImportOrFailNamingFileAndKey) {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  const auto dir = (fs::temp_directory_path() / fmt::format("mf_fuzz_hf_{}", ::getpid())).string();
  const auto out = dir + "_ckpt";
  fs::remove_all(dir);
  const auto cmd = fmt::format(
      "/usr/bin/python3 {}/tests/io/hf_reference.py --arch qwen3_moe --shards 2 --out {} "
      "--no-reference > /dev/null",
      src ? src : ".", dir);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the Python reference (python3-torch; scripts/setup.sh): " << cmd;
  const std::vector<std::string> files = {"config.json", "model.safetensors.index.json",
                                          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  std::map<std::string, std::string> pristine;
  for (const auto& f : files) pristine[f] = read_file(dir + "/" + f);
  std::string edited;  // the file the current case changed
  const auto o = run_cases<ClearImport>(
      "hf import", std::max<int64_t>(1, cases() / 10),
      [&](SplitMix64& rng) {
        edited = files[rng.below(files.size())];
        const auto& p = pristine[edited];
        if (edited == "config.json") return mutate_config(p, rng);
        if (edited == "model.safetensors.index.json") return mutate_index(p, rng);
        return mutate_safetensors(p, rng);
      },
      [&](const std::string& bytes) {
        write_file_atomic(dir + "/" + edited, bytes);
        try {
          hf::import_hf(dir, out);
        } catch (const FormatError& e) {
          write_file_atomic(dir + "/" + edited, pristine[edited]);
          throw ClearImport(e.what());
        } catch (const ConfigError& e) {
          write_file_atomic(dir + "/" + edited, pristine[edited]);
          throw ClearImport(e.what());
        } catch (...) {
          write_file_atomic(dir + "/" + edited, pristine[edited]);
          throw;
        }
        write_file_atomic(dir + "/" + edited, pristine[edited]);
        fs::remove_all(out);
      });
  expect_only_success_or_clear(o);
  fs::remove_all(dir);
  fs::remove_all(out);
}

}  // namespace
