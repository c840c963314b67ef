// Hugging Face interop: tiny random models in exact HF layout written by an independent Python
// reference (tests/io/hf_reference.py, Debian's python3-torch) are imported and must give the
// reference's logits (float32, max |difference| <= 1e-4) and router top-k choices; import ->
// export is byte-identical, export -> import keeps the logits; broken directories name the
// file, key or tensor.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "core/util.h"
#include "io/hf/arch.h"
#include "io/hf/hf_dir.h"
#include "io/hf_fixture.h"
#include "io/model_io.h"
#include "io/upcycle.h"
#include "model/moe_ffn.h"

using namespace mf;
namespace fs = std::filesystem;

namespace {

// Writes the reference's tiny model of `arch` into a fresh directory of this test (ctest runs
// tests in parallel processes) and returns it.
std::string reference_model(const std::string& arch, const std::string& dtype, int shards) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const auto dir =
      (fs::temp_directory_path() / fmt::format("mf_hf_{}_{}_{}_{}_{}", ::getpid(), test->name(), arch, dtype, shards))
          .string();
  fs::remove_all(dir);
  const auto cmd = fmt::format("/usr/bin/python3 {}/tests/io/hf_reference.py --arch {} --dtype {} --shards {} --out {}",
                               hf_fixture::source_dir(), arch, dtype, shards, dir);
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("the Python reference failed (needs Debian's python3-torch; scripts/setup.sh): " + cmd);
  return dir;
}

struct Run {
  at::Tensor logits;
  std::map<int64_t, at::Tensor> topk;  // block -> [tokens, k] chosen experts
};

Run run_ours(const std::string& checkpoint, const at::Tensor& ids) {
  auto model = load_model(checkpoint).model;
  model->eval();
  Run r;
  for (auto& m : moe_layers(model->feed_forwards())) {
    const int64_t layer = m->layer, k = m->gate->options().top_k;
    m->dispatch_hook = [&r, layer, k](const at::Tensor&, const RouterOutput& out) {
      r.topk[layer] = out.assignment.unit_P.view({-1, k}).clone();
    };
  }
  torch::NoGradGuard g;
  r.logits = model->forward(ids);
  return r;
}

std::set<int64_t> row_set(const at::Tensor& t, int64_t row) {
  std::set<int64_t> s;
  for (int64_t j = 0; j < t.size(1); ++j) s.insert(t[row][j].item<int64_t>());
  return s;
}

}  // namespace

TEST(HfImport, LogitsAndRoutingMatchTheReferenceForEveryArchitecture) {
  struct Case {
    std::string arch, dtype;
    int shards;
  };
  for (const auto& c : std::vector<Case>{{"llama", "f32", 1},
                                         {"mixtral", "bf16", 2},
                                         {"qwen2_moe", "f32", 3},
                                         {"qwen3_moe", "bf16", 1},
                                         {"olmoe", "f16", 2}}) {
    SCOPED_TRACE(c.arch + " " + c.dtype);
    const auto dir = reference_model(c.arch, c.dtype, c.shards);
    const auto ckpt = dir + "_ckpt";
    const auto report = hf::import_hf(dir, ckpt);
    EXPECT_EQ(report.arch, c.arch);
    const auto ref = load_safetensors(dir + "/reference.safetensors");
    const auto ours = run_ours(ckpt, ref.at("ids"));
    ASSERT_EQ(ours.logits.sizes(), ref.at("logits").sizes());
    const double diff = (ours.logits - ref.at("logits")).abs().max().item<double>();
    EXPECT_LE(diff, 1e-4) << "max |logit difference|";
    std::printf("%s %s: max |logit difference| %.3g\n", c.arch.c_str(), c.dtype.c_str(), diff);
    EXPECT_GT(ref.at("logits").abs().max().item<double>(), 1.0);  // the comparison is not between zeros
    int64_t layers = 0;
    for (auto& [name, t] : ref.tensors) {
      if (name.rfind("topk.", 0) != 0) continue;
      const int64_t layer = std::stoll(name.substr(5));
      ASSERT_TRUE(ours.topk.count(layer)) << "block " << layer << " is not MoE here";
      for (int64_t tok = 0; tok < t.size(0); ++tok)
        EXPECT_EQ(row_set(ours.topk.at(layer), tok), row_set(t, tok)) << "block " << layer << " token " << tok;
      ++layers;
    }
    EXPECT_EQ(layers, static_cast<int64_t>(ours.topk.size()));
    // eval / generate / info open the directory itself: the same model as the imported checkpoint
    EXPECT_TRUE(torch::equal(run_ours(dir, ref.at("ids")).logits, ours.logits));
    fs::remove_all(dir);
    fs::remove_all(ckpt);
  }
}

TEST(HfRoundTrip, ImportExportIsByteIdenticalAndExportImportKeepsLogits) {
  for (const std::string arch : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "llama"}) {
    SCOPED_TRACE(arch);
    const auto dir = reference_model(arch, "bf16", 2);
    const auto ckpt = dir + "_ckpt", back = dir + "_back", again = dir + "_again";
    hf::import_hf(dir, ckpt);
    hf::ExportOptions o;
    o.dtype = at::kBFloat16;
    o.shard_bytes = 20000;  // several shards
    const auto r = hf::export_hf(ckpt, back, o);
    EXPECT_EQ(r.arch, arch);
    EXPECT_GT(r.shards, 1);
    EXPECT_TRUE(fs::exists(back + "/model.safetensors.index.json"));
    hf::HfDir original(dir), exported(back);
    auto names = original.names();
    EXPECT_EQ(names, exported.names());
    for (auto& n : names) {
      auto a = original.read(n), b = exported.read(n);
      ASSERT_EQ(a.scalar_type(), b.scalar_type()) << n;
      EXPECT_TRUE(torch::equal(a, b)) << n;
    }
    const auto cfg_in = nlohmann::json::parse(read_file(dir + "/config.json"));
    const auto cfg_out = nlohmann::json::parse(read_file(back + "/config.json"));
    for (auto& [key, value] : cfg_in.items())
      // equivalent spellings of the sparse blocks are compared through the configs they give (below)
      if (cfg_out.contains(key) && key != "sliding_window" && key != "decoder_sparse_step" &&
          key != "mlp_only_layers") {
        EXPECT_EQ(cfg_out[key], value) << "config.json key " << key;
      }
    EXPECT_EQ(to_toml(original.config()), to_toml(exported.config()));
    // export -> import: the same model
    hf::import_hf(back, again);
    const auto ids = load_safetensors(dir + "/reference.safetensors").at("ids");
    EXPECT_TRUE(torch::equal(run_ours(ckpt, ids).logits, run_ours(again, ids).logits));
    for (auto& d : {dir, ckpt, back, again}) fs::remove_all(d);
  }
}

TEST(HfImport, AbsentKeysTakeTransformersDefaultsPerArchitecture) {
  const nlohmann::json base = {{"hidden_size", 64},           {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},    {"vocab_size", 100},
                               {"intermediate_size", 96},     {"num_local_experts", 4},
                               {"num_experts_per_tok", 2},    {"num_experts", 4},
                               {"moe_intermediate_size", 32}, {"shared_expert_intermediate_size", 16}};
  auto read = [&](const std::string& type) {
    ModelConfig m;
    hf::arch_named(type, "config.json").read(hf::ConfigReader(base, "config.json"), m);
    return std::pair{m.rope_theta, m.norm_eps};
  };
  // transformers' MixtralConfig: rope_theta 1e6, rms_norm_eps 1e-5; OlmoeConfig: 1e4, 1e-5;
  // LlamaConfig, Qwen2MoeConfig, Qwen3MoeConfig: 1e4, 1e-6
  EXPECT_EQ(read("mixtral"), std::pair(1e6, 1e-5));
  EXPECT_EQ(read("olmoe"), std::pair(1e4, 1e-5));
  EXPECT_EQ(read("llama"), std::pair(1e4, 1e-6));
  EXPECT_EQ(read("qwen2_moe"), std::pair(1e4, 1e-6));
  EXPECT_EQ(read("qwen3_moe"), std::pair(1e4, 1e-6));
}

TEST(HfImport, BrokenDirectoriesNameTheFileKeyOrTensor) {
  const auto dir = reference_model("qwen2_moe", "f32", 2);
  const auto out = dir + "_ckpt";
  auto config = nlohmann::json::parse(read_file(dir + "/config.json"));
  auto with_config = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto c = config;
    edit(c);
    write_file_atomic(dir + "/config.json", c.dump());
    return hf_fixture::error_of([&] { hf::import_hf(dir, out); });
  };
  EXPECT_NE(with_config([](auto& c) { c["model_type"] = "gpt_oss"; }).find("\"gpt_oss\" is not supported"),
            std::string::npos);
  EXPECT_NE(with_config([](auto& c) {
              c["rope_scaling"] = {{"type", "yarn"}};
            }).find("\"rope_scaling\""),
            std::string::npos);
  EXPECT_NE(with_config([](auto& c) { c.erase("num_experts"); }).find("\"num_experts\" is missing"), std::string::npos);
  const auto shape = with_config([](auto& c) { c["moe_intermediate_size"] = 8; });
  EXPECT_NE(shape.find("model.layers.0.mlp.experts.gate_up_proj"), std::string::npos) << shape;
  // values that used to crash (SIGFPE), hang or build a model that cannot work: refused, naming the key
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"num_attention_heads", 0},
                                                           {"num_key_value_heads", 0},
                                                           {"num_key_value_heads", -1},
                                                           {"num_key_value_heads", 3},
                                                           {"num_hidden_layers", 1000000},
                                                           {"num_hidden_layers", 2147483648LL},
                                                           {"head_dim", 0},
                                                           {"hidden_size", 0},
                                                           {"rope_theta", 0},
                                                           {"rms_norm_eps", -1.0},
                                                           {"max_position_embeddings", -1},
                                                           {"max_position_embeddings", 0},
                                                           {"moe_intermediate_size", -1},
                                                           {"moe_intermediate_size", 1000000},  // took 38 s, 6 GB
                                                           {"num_experts", 1000000},
                                                           {"num_experts_per_tok", 1000}}) {
    const auto e = with_config([&, key = key, value = value](auto& c) { c[key] = value; });
    EXPECT_NE(e.find("\"" + key + "\""), std::string::npos) << key << " = " << value << ": " << e;
  }
  EXPECT_EQ(with_config([](auto&) {}), "");  // the control: the intact directory imports
  fs::remove_all(out);
  // a tensor the config has no place for
  {
    auto extra = config;
    extra["mlp_only_layers"] = {0, 1};
    write_file_atomic(dir + "/config.json", extra.dump());
    const auto e = hf_fixture::error_of([&] { hf::import_hf(dir, out); });
    EXPECT_NE(e.find("model.layers.0.mlp."), std::string::npos) << e;
    write_file_atomic(dir + "/config.json", config.dump());
  }
  {  // an index naming a shard no file system can hold (an unclear filesystem_error before)
    const auto index_file = dir + "/model.safetensors.index.json";
    const auto index = read_file(index_file);
    auto edited = nlohmann::json::parse(index);
    edited["weight_map"].begin().value() = std::string(1000, 'x');
    write_file_atomic(index_file, edited.dump());
    const auto e = hf_fixture::error_of([&] { hf::import_hf(dir, out); });
    EXPECT_NE(e.find("must be a file name in the directory"), std::string::npos) << e;
    write_file_atomic(index_file, index);
  }
  const auto shard = dir + "/model-00002-of-00002.safetensors";
  const auto bytes = read_file(shard);
  {  // an F32 tensor relabelled I32 (the same size): refused naming it, not imported as floats
    auto relabelled = bytes;
    const auto at = relabelled.find("\"F32\"");  // the first tensor's dtype in the header
    ASSERT_NE(at, std::string::npos);
    relabelled.replace(at + 1, 3, "I32");
    write_file_atomic(shard, relabelled);
    const auto e = hf_fixture::error_of([&] { hf::import_hf(dir, out); });
    EXPECT_NE(e.find("is stored as Int, an integer dtype"), std::string::npos) << e;
    write_file_atomic(shard, bytes);
  }
  {  // truncated shard
    std::ofstream(shard, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    const auto e = hf_fixture::error_of([&] { hf::import_hf(dir, out); });
    EXPECT_NE(e.find(shard), std::string::npos) << e;
  }
  {  // the index lists a shard that is not there
    fs::remove(shard);
    const auto e = hf_fixture::error_of([&] { hf::import_hf(dir, out); });
    EXPECT_NE(e.find("model-00002-of-00002.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("missing"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(out));  // nothing half-written
  fs::remove_all(dir);
}

TEST(HfExport, RefusesWhatHuggingFaceCannotHold) {
  const auto dir = reference_model("mixtral", "f32", 1);
  const auto ckpt = dir + "_ckpt";
  hf::import_hf(dir, ckpt);
  hf::ExportOptions o;
  o.arch = "olmoe";  // Mixtral's attention has no q/k norm
  EXPECT_NE(hf_fixture::error_of([&] { hf::export_hf(ckpt, dir + "_out", o); }).find("model.qk_norm"),
            std::string::npos);
  o.arch = "falcon";
  EXPECT_NE(hf_fixture::error_of([&] { hf::export_hf(ckpt, dir + "_out", o); }).find("not supported"),
            std::string::npos);
  EXPECT_THROW(hf::parse_dtype("f8"), ConfigError);
  EXPECT_EQ(hf::parse_size("5GB"), 5000000000LL);
  EXPECT_EQ(hf::parse_size("2 MiB"), 2097152);
  EXPECT_THROW(hf::parse_size("lots"), ConfigError);
  fs::remove_all(dir);
  fs::remove_all(ckpt);
}

TEST(SafetensorsWriter, StreamsTheSameBytesAndLeavesNothingWhenInterrupted) {
  const auto path = (fs::temp_directory_path() / "mf_writer.safetensors").string();
  const NamedTensors tensors = {
      {"b", torch::randn({3, 4})}, {"a", torch::arange(5)}, {"c", torch::randn({2}).to(at::kBFloat16)}};
  std::vector<TensorSpec> specs;
  for (auto& [n, t] : tensors) specs.push_back({n, t.scalar_type(), t.sizes().vec()});
  {
    SafetensorsWriter w(path, specs, {{"k", "v"}});
    for (auto& [n, t] : tensors) w.write(t);
    w.finish();
  }
  EXPECT_EQ(read_file(path), serialize_safetensors(tensors, {{"k", "v"}}));
  fs::remove(path);
  {
    SafetensorsWriter w(path, specs);
    EXPECT_THROW(w.write(torch::randn({4, 3})), FormatError);  // not the declared shape
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

// upcycle streams a Hugging Face LLaMA directory into a Mixtral one in its dtype: the independent
// reader accepts its names and shapes, and top-k experts that are all the dense FFN (weights
// renormalised) compute the dense model's logits.
TEST(HfUpcycle, LlamaInMixtralOut) {
  const auto dir = hf_fixture::scratch("upcycle");
  const auto in = hf_fixture::tiny_model(dir / "llama", "llama", {"attention_bias=false"}, "--dtype bf16");
  UpcycleOptions o;
  o.layers = {0, 1};
  o.experts = 3;
  o.sets = {"model.moe.renormalize=true"};
  const auto r = upcycle(in, (dir / "moe").string(), o);
  EXPECT_EQ(r.hf_arch, "mixtral");
  const auto config = read_json_file((dir / "moe/config.json").string());
  EXPECT_EQ(config["model_type"], "mixtral");
  EXPECT_EQ(config["num_local_experts"], 3);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");
  EXPECT_FALSE(fs::exists((dir / "moe.checkpoint-tmp")));
  const auto check = fmt::format("/usr/bin/python3 {}/tests/io/hf_reference.py --check {}", hf_fixture::source_dir(),
                                 (dir / "moe").string());
  ASSERT_EQ(std::system(check.c_str()), 0) << check;
  const auto ids = torch::randint(0, 64, {1, 9}, torch::kLong);
  auto logits = [&](const std::string& path) {
    auto model = load_model(path).model;
    model->eval();
    torch::NoGradGuard g;
    return model->forward(ids);
  };
  const auto want = logits(in);
  EXPECT_LT((logits((dir / "moe").string()) - want).abs().max().item<double>(), 1e-5 * want.abs().max().item<double>());
}
