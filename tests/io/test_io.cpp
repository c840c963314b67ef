// safetensors round trip and rejection of damaged files; checkpoint directories.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "io/safetensors.h"

using namespace mf;
namespace fs = std::filesystem;

namespace {

NamedTensors sample_tensors() {
  return {{"a.weight", torch::randn({3, 4})},        {"b", torch::arange(6, torch::kLong).view({2, 3})},
          {"c", torch::randn({5}, torch::kFloat64)}, {"d", torch::randn({2, 2}).to(torch::kBFloat16)},
          {"e", torch::randn({2}).to(torch::kHalf)}, {"f", torch::tensor({true, false, true})},
          {"g", torch::tensor({1, 2}, torch::kInt)}, {"h", torch::tensor({7}, torch::kByte)},
          {"empty", torch::empty({0, 3})},           {"scalar", torch::tensor(3.5)}};
}

std::string make_file(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header_json + data;
}

std::string error_of(const std::string& bytes) {
  try {
    parse_safetensors(bytes, "x.safetensors");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypesAndMetadata) {
  auto tensors = sample_tensors();
  auto bytes = serialize_safetensors(tensors, {{"format", "pt"}, {"note", "hello"}});
  auto back = parse_safetensors(bytes, "mem");
  EXPECT_EQ(back.metadata.at("note"), "hello");
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (auto& [name, t] : tensors) {
    auto& u = back.at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(u.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(u, t)) << name;
  }
}

TEST(Safetensors, HeaderFollowsTheSpec) {
  auto bytes = serialize_safetensors({{"w", torch::ones({2, 3})}}, {{"k", "v"}});
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["w"]["dtype"], "F32");
  EXPECT_EQ(h["w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["w"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  EXPECT_EQ(bytes.size(), 8 + n + 24);
}

TEST(Safetensors, RejectsEveryTruncation) {
  auto bytes = serialize_safetensors(sample_tensors());
  for (size_t len = 0; len < bytes.size(); len += std::max<size_t>(1, bytes.size() / 97)) {
    auto e = error_of(bytes.substr(0, len));
    EXPECT_NE(e, "") << "truncated to " << len << " bytes was accepted";
    EXPECT_NE(e.find("x.safetensors"), std::string::npos);
  }
  EXPECT_NE(error_of(bytes.substr(0, bytes.size() - 1)), "");
}

TEST(Safetensors, RejectsGarbledFiles) {
  auto bytes = serialize_safetensors({{"w", torch::ones({2})}});
  auto huge = bytes;
  huge[7] = 0x7f;
  EXPECT_NE(error_of(huge).find("implausible"), std::string::npos);
  auto longer = bytes;
  longer[0] = static_cast<char>(longer[0] + 16);
  EXPECT_NE(error_of(longer), "");
  EXPECT_NE(error_of(make_file("{not json", "")).find("JSON"), std::string::npos);
  EXPECT_NE(error_of(make_file("[1,2]", "")).find("object"), std::string::npos);
  EXPECT_NE(error_of(make_file(R"({"w":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", "abcd")).find("dtype"),
            std::string::npos);
  EXPECT_NE(error_of(make_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd")), "");
  EXPECT_NE(error_of(make_file(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd")).find("lacks"), std::string::npos);
  EXPECT_NE(error_of(make_file(R"({"__metadata__":{"a":1}})", "")).find("__metadata__"), std::string::npos);
}

TEST(Safetensors, RejectsBadOffsets) {
  const std::string data(16, 'x');
  // out of bounds
  EXPECT_NE(
      error_of(make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", data)).find("out of bounds"),
      std::string::npos);
  // size does not match the shape
  EXPECT_NE(error_of(make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data)).find("shape needs"),
            std::string::npos);
  // overlapping
  EXPECT_NE(error_of(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                               std::string(12, 'x')))
                .find("overlaps"),
            std::string::npos);
  // hole
  EXPECT_NE(error_of(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data)).find("hole"),
            std::string::npos);
  // trailing bytes
  EXPECT_NE(error_of(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data)).find("trailing"),
            std::string::npos);
  // reversed
  EXPECT_NE(error_of(make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data)), "");
}

TEST(Safetensors, MissingFileIsAFormatError) {
  EXPECT_THROW(load_safetensors("/nonexistent/model.safetensors"), FormatError);
}

TEST(Checkpoint, WritesAtomicallyAndReadsBack) {
  auto root = fs::temp_directory_path() / "mf_ckpt_test";
  fs::remove_all(root);
  CheckpointContents c;
  c.model = {{"w", torch::randn({4})}};
  c.optimizer = {{"w.exp_avg", torch::zeros({4})}};
  c.model_metadata = {{"moeforge.config", "[train]\nsteps = 3\n"}};
  c.trainer_state = {{"step", 3}};
  write_checkpoint((root / "checkpoints" / "step_00000003").string(), c);
  c.trainer_state = {{"step", 10}};
  write_checkpoint((root / "checkpoints" / "step_00000010").string(), c);
  EXPECT_EQ(latest_checkpoint(root.string()), (root / "checkpoints" / "step_00000010").string());
  auto ck = read_checkpoint(root.string());
  EXPECT_EQ(ck.trainer_state()["step"], 10);
  EXPECT_TRUE(torch::equal(ck.model.at("w"), c.model[0].second));
  EXPECT_EQ(ck.config_toml(), "[train]\nsteps = 3\n");
  auto ck2 = read_checkpoint((root / "checkpoints" / "step_00000003" / "model.safetensors").string());
  EXPECT_EQ(ck2.trainer_state()["step"], 3);
  for (auto& e : fs::directory_iterator(root / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos);
  prune_checkpoints((root / "checkpoints").string(), 1);
  EXPECT_FALSE(fs::exists(root / "checkpoints" / "step_00000003"));
  EXPECT_TRUE(fs::exists(root / "checkpoints" / "step_00000010"));
  // a damaged model file is detected, with the path in the message
  auto model_file = (root / "checkpoints" / "step_00000010" / "model.safetensors").string();
  auto bytes = read_file(model_file);
  write_file_atomic(model_file, bytes.substr(0, bytes.size() - 3));
  try {
    read_checkpoint(root.string());
    FAIL() << "truncated checkpoint accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos);
  }
  EXPECT_THROW(read_checkpoint((root / "nothing").string()), FormatError);
  fs::remove_all(root);
}

// Checkpoints written before the layout change (flat model.moe.pool_* / latent keys in their
// config, tests/fixtures/pre_layout/, made by that commit's code) load and give the logits they
// gave then: a vanilla MoE with aux-free bias and a shared expert, UniPool with NormRouter and
// pool loss (G = 2), and LatentMoE with four different latent shapes under a sigmoid router.
TEST(ModelIO, PreLayoutCheckpointsGiveIdenticalLogits) {
  const std::string dir = std::string(std::getenv("MOEFORGE_SOURCE_DIR")) + "/tests/fixtures/pre_layout/";
  for (std::string name : {"vanilla_bias", "unipool", "latent"}) {
    auto st = load_safetensors(dir + name + ".model.safetensors");
    Config cfg;
    apply_toml_text(cfg, st.metadata.at("moeforge.config"), name);
    validate(cfg);
    cfg.model.vocab_size = std::stoll(st.metadata.at("moeforge.vocab_size"));
    TransformerLM m(cfg.model);
    load_model_tensors(*m, st);
    m->eval();
    torch::NoGradGuard g;
    auto expected = load_safetensors(dir + name + ".logits.safetensors");
    auto logits = m->forward(expected.at("tokens"));
    EXPECT_TRUE(torch::equal(logits, expected.at("logits")))
        << name << ": max diff " << (logits - expected.at("logits")).abs().max().item<double>();
  }
}
