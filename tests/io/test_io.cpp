// safetensors round trip and rejection of damaged files; checkpoint directories.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/model_io.h"
#include "io/safetensors.h"
#include "io/upcycle.h"
#include "model/moe_ffn.h"

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
  EXPECT_THROW(SafetensorsFile("/nonexistent/model.safetensors"), FormatError);
}

// The streaming reader sees what the whole-file reader sees, one tensor at a time, and refuses
// the same damaged files from their header.
TEST(Safetensors, StreamedTensorsEqualTheLoadedOnes) {
  const auto path = (std::filesystem::temp_directory_path() / "mf_stream.safetensors").string();
  const auto tensors = sample_tensors();
  save_safetensors(path, tensors, {{"k", "v"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_EQ(f.header().tensors.size(), tensors.size());
  for (auto& [name, t] : tensors) EXPECT_TRUE(torch::equal(f.read(name), t)) << name;
  auto into = at::zeros_like(tensors[0].second);
  f.read_into(tensors[0].first, into);
  EXPECT_TRUE(torch::equal(into, tensors[0].second));
  auto wrong = at::zeros({7, 7});
  EXPECT_THROW(f.read_into(tensors[0].first, wrong), FormatError);
  try {
    f.read("absent");
    FAIL() << "read a missing tensor";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("absent"), std::string::npos);
  }
  const auto bytes = serialize_safetensors(tensors);
  write_file_atomic(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_THROW(SafetensorsFile{path}, FormatError);
  std::filesystem::remove(path);
}

// A million nested arrays in a header is a clear error, not a stack overflow; bytes of one
// dtype relabelled as another of the same size are refused, not converted.
TEST(Safetensors, DeepNestingAndRelabelledDtypesAreClearErrors) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  const auto e = error_of(make_file(R"({"a":{"dtype":)" + deep + R"(,"shape":[],"data_offsets":[0,0]}})", ""));
  EXPECT_NE(e.find("nests deeper than 64"), std::string::npos) << e.substr(0, 200);
  const auto path = (fs::temp_directory_path() / fmt::format("mf_relabel_{}.safetensors", ::getpid())).string();
  save_safetensors(path, {{"w", torch::ones({2})}});
  auto bytes = read_file(path);
  bytes.replace(bytes.find("F32"), 3, "I32");
  write_file_atomic(path, bytes);
  const SafetensorsFile file(path);
  at::Tensor dst = torch::zeros({2});
  try {
    file.read_into("w", dst);
    FAIL() << "relabelled tensor accepted";
  } catch (const FormatError& err) {
    EXPECT_NE(std::string(err.what()).find("tensor 'w' is stored as Int but must be Float"), std::string::npos)
        << err.what();
  }
  torch::nn::Linear lin(2, 1);
  EXPECT_THROW(
      load_model_tensors(*lin, {{{"weight", torch::ones({1, 2}, torch::kInt)}, {"bias", torch::ones({1})}}, {}}),
      FormatError);
  fs::remove(path);
}

// Removal leaves the step_* namespace by a rename first; a partial step_* (from an older
// version's kill), .tmp-* and .del-* are invisible to readers and cleaned on the next start.
TEST(Checkpoint, RotationIsAtomicAndLeftoversAreIgnoredThenCleaned) {
  const auto root = fs::temp_directory_path() / fmt::format("mf_rotation_{}", ::getpid());
  fs::remove_all(root);
  CheckpointContents c;
  c.model = {{"w", torch::randn({4})}};
  c.trainer_state = {{"step", 1}};
  const auto dir = root / "checkpoints";
  for (int s : {1, 2, 3}) write_checkpoint((dir / fmt::format("step_{:08d}", s)).string(), c);
  fs::create_directories(dir / "step_00000004");  // partial: only the model
  fs::copy_file(dir / "step_00000003" / "model.safetensors", dir / "step_00000004" / "model.safetensors");
  fs::create_directories(dir / ".tmp-step_00000005");
  fs::create_directories(dir / ".del-step_00000000");
  EXPECT_EQ(latest_checkpoint(root.string()), (dir / "step_00000003").string());
  prune_checkpoints(dir.string(), 2);
  EXPECT_FALSE(fs::exists(dir / "step_00000001"));
  EXPECT_TRUE(fs::exists(dir / "step_00000002"));
  EXPECT_EQ(clean_checkpoint_leftovers(dir.string()), 3);
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000002", "step_00000003"}));
  write_checkpoint((dir / "step_00000003").string(), c);  // the same step again replaces it whole
  EXPECT_EQ(latest_checkpoint(root.string()), (dir / "step_00000003").string());
  fs::remove_all(root);
}

TEST(Checkpoint, StoredConfigIsValidatedNamingTheFile) {
  const auto root = fs::temp_directory_path() / fmt::format("mf_stored_cfg_{}", ::getpid());
  fs::remove_all(root);
  CheckpointContents c;
  c.model = {{"w", torch::randn({4})}};
  c.trainer_state = {{"step", 1}};
  c.model_metadata = {{"moeforge.config", "[model]\nd_model = 100\nn_heads = 8\n"}, {"moeforge.vocab_size", "400"}};
  write_checkpoint((root / "bad_config").string(), c);
  try {
    checkpoint_config((root / "bad_config").string());
    FAIL() << "inconsistent stored config accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors [moeforge.config]: model.d_model (100)"), std::string::npos)
        << e.what();
  }
  c.model_metadata = {{"moeforge.config", "[train]\nsteps = 3\n"}, {"moeforge.vocab_size", "400abc"}};
  write_checkpoint((root / "bad_vocab").string(), c);
  EXPECT_THROW(checkpoint_config((root / "bad_vocab").string()), FormatError);
  fs::remove_all(root);
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
// Up to float32 reassociation: the engine's kernels have since changed their summation order
// (moe/combine, model/small_attention; ~1e-7 here), while a misplaced tensor moves logits by O(1).
TEST(ModelIO, PreLayoutCheckpointsGiveTheirLogits) {
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
    EXPECT_TRUE(torch::allclose(logits, expected.at("logits"), 1e-5, 1e-5))
        << name << ": max diff " << (logits - expected.at("logits")).abs().max().item<double>();
  }
}

namespace {

// A dense model of `cfg` with random weights, written as a checkpoint; returns its directory.
template <class Model>
std::string dense_checkpoint(const Config& cfg, Model& m, const std::string& name) {
  m->init_weights(1);
  {
    torch::NoGradGuard g;
    for (auto& p : m->parameters()) p.add_(torch::randn_like(p) * 0.05);  // biases and gains not at their init
  }
  auto dir = (fs::temp_directory_path() / ("mf_upcycle_" + name)).string();
  fs::remove_all(dir);
  write_checkpoint(dir, {model_tensors(*m),
                         {},
                         {{"moeforge.config", to_toml(cfg)},
                          {"moeforge.step", "7"},
                          {"moeforge.vocab_size", std::to_string(cfg.model.vocab_size)}},
                         {{"step", 7}},
                         ""});
  return dir;
}

Config tiny_dense(const std::string& task, const std::string& ffn) {
  Config c;
  c.model.task = task;
  c.model.vocab_size = task == "lm" ? 40 : 0;
  c.model.d_model = 16;
  c.model.n_layers = 3;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 4;
  c.model.ffn = ffn;
  c.model.ffn_hidden = 24;
  c.model.image_size = 8;
  c.model.num_classes = 5;
  c.run.name = "dense";
  return c;
}

}  // namespace

// Top-k upcycling with renormalised weights: every expert is the dense FFN and the weights of
// a token sum to 1, so the upcycled model computes the dense function (float64: to rounding).
TEST(Upcycle, TopKModelEqualsTheDenseModel) {
  for (std::string task : {"classify", "lm"})
    for (std::string ffn : {"gelu", "swiglu"}) {
      if (task == "classify" && ffn == "swiglu") continue;
      auto cfg = tiny_dense(task, ffn);
      UpcycleOptions o;
      o.layers = {0, 2};
      o.experts = 3;
      at::Tensor input = task == "lm" ? torch::randint(40, {2, 7}, torch::kLong) : torch::randn({3, 1, 8, 8});
      auto logits = [&](auto model) {
        model->to(torch::kFloat64);
        model->eval();
        torch::NoGradGuard g;
        return model->forward(task == "lm" ? input : input.to(torch::kFloat64));
      };
      std::string dir;
      at::Tensor dense;
      if (task == "lm") {
        TransformerLM m(cfg.model);
        dir = dense_checkpoint(cfg, m, task + ffn);
        dense = logits(m);
      } else {
        VisionTransformer m(cfg.model);
        dir = dense_checkpoint(cfg, m, task + ffn);
        dense = logits(m);
      }
      auto r = upcycle(dir, dir + "_topk", o);
      EXPECT_EQ(r.converted, 2 * (ffn == "gelu" ? 4 : 2)) << task << ffn;
      EXPECT_EQ(r.config.model.moe.layers, "0,2");
      EXPECT_EQ(r.config.run.name, "dense-topk");
      auto up = task == "lm" ? logits(load_model(dir + "_topk").model) : logits(load_classifier(dir + "_topk").model);
      EXPECT_TRUE(torch::allclose(up, dense, 1e-5, 1e-6))
          << task << " " << ffn << ": max diff " << (up - dense).abs().max().item<double>();
      fs::remove_all(dir), fs::remove_all(dir + "_topk");
    }
}

// UniF-MoE upcycling: the shared and every residual expert equal the dense FFN on any input, the
// other tensors are the dense ones bit for bit, and the router starts with orthonormal rows.
TEST(Upcycle, UniFExpertsAreTheDenseFfnAndRouterIsOrthonormal) {
  auto cfg = tiny_dense("classify", "gelu");
  VisionTransformer dense(cfg.model);
  auto dir = dense_checkpoint(cfg, dense, "unif");
  UpcycleOptions o;
  o.layers = {1};
  o.method = "unif";
  o.experts = 3;
  o.blocks = 4;
  upcycle(dir, dir + "_unif", o);
  auto up = load_classifier(dir + "_unif");
  auto moe = moe_layers(up.model->feed_forwards());
  ASSERT_EQ(moe.size(), 1u);
  auto x = torch::randn({5, 16});
  AuxLosses aux;
  auto want = dense->blocks[1]->mlp->forward(x, aux);
  for (int64_t e = 0; e < 4; ++e) EXPECT_TRUE(torch::allclose(moe[0]->experts->forward_unit(e, x), want, 1e-5, 1e-6));
  auto w = moe[0]->gate->weight;
  EXPECT_TRUE(torch::allclose(torch::matmul(w, w.t()), torch::eye(4), 1e-5, 1e-5));
  auto before = load_classifier(dir).model;
  EXPECT_TRUE(torch::equal(up.model->head->weight, before->head->weight));
  EXPECT_TRUE(torch::equal(up.model->blocks[0]->attn->qkv->weight, before->blocks[0]->attn->qkv->weight));
  // noise makes the copies differ, by about the requested fraction of the weights' spread
  o.noise = 0.01;
  upcycle(dir, dir + "_noisy", o);
  auto noisy = moe_layers(load_classifier(dir + "_noisy").model->feed_forwards())[0]->experts;
  auto diff = (noisy->gate_up_proj[1] - noisy->gate_up_proj[2]).std().item<double>();
  auto spread = moe[0]->experts->gate_up_proj[1].std().item<double>();
  EXPECT_NEAR(diff / spread, 0.01 * std::sqrt(2.0), 0.005);
  for (auto d : {dir, dir + "_unif", dir + "_noisy"}) fs::remove_all(d);
}

// The streamed upcycle (tensor by tensor) equals the in-memory recipe bit for bit: the upcycled
// model built and initialised by role from the seed, every dense tensor copied, each upcycled
// block's bank E copies of its dense FFN plus noise drawn expert by expert from seed + 1.
TEST(Upcycle, StreamedEqualsTheInMemoryRecipeBitForBit) {
  for (std::string ffn : {"gelu", "swiglu"}) {
    auto cfg = tiny_dense("lm", ffn);
    TransformerLM dense_model(cfg.model);
    const auto dir = dense_checkpoint(cfg, dense_model, "stream" + ffn);
    UpcycleOptions o;
    o.layers = {1, 2};
    o.experts = 3;
    o.noise = 0.02;
    o.seed = 5;
    const auto r = upcycle(dir, dir + "_s", o);
    const auto dense = read_checkpoint(dir).model.tensors;
    TransformerLM want(r.config.model);
    want->init_weights(o.seed);
    auto noise = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1);
    torch::NoGradGuard g;
    for (auto& p : want->named_parameters()) {
      const auto& name = p.key();
      const auto bank = name.find(".mlp.experts.");
      if (bank != std::string::npos) {
        const auto mlp = name.substr(0, bank + 5), local = name.substr(bank + 13);
        const std::map<std::string, at::Tensor> parts =
            ffn == "gelu"
                ? std::map<std::string, at::Tensor>{{"gate_up_proj", dense.at(mlp + "fc1.weight")},
                                                    {"down_proj", dense.at(mlp + "fc2.weight")},
                                                    {"gate_up_proj_bias", dense.at(mlp + "fc1.bias")},
                                                    {"down_proj_bias", dense.at(mlp + "fc2.bias")}}
                : std::map<std::string, at::Tensor>{
                      {"gate_up_proj", at::cat({dense.at(mlp + "gate_proj.weight"), dense.at(mlp + "up_proj.weight")})},
                      {"down_proj", dense.at(mlp + "down_proj.weight")}};
        const auto& src = parts.at(local);
        for (int64_t e = 0; e < o.experts; ++e) {
          auto copy = src.clone();
          if (src.dim() == 2) copy += o.noise * src.std().item<double>() * at::empty_like(copy).normal_(0, 1, noise);
          p.value()[e].copy_(copy);
        }
      } else if (name.find(".mlp.gate.") == std::string::npos) {
        p.value().copy_(dense.at(name));
      }
    }
    const auto got = read_checkpoint(dir + "_s").model.tensors;
    for (auto& [name, t] : model_tensors(*want)) EXPECT_TRUE(got.at(name).equal(t)) << ffn << ": " << name;
    EXPECT_EQ(got.size(), model_tensors(*want).size());
    fs::remove_all(dir), fs::remove_all(dir + "_s");
  }
}

TEST(Upcycle, RefusesWhatItCannotConvert) {
  auto cfg = tiny_dense("lm", "swiglu");
  UpcycleOptions o;
  o.layers = {5};
  EXPECT_THROW(upcycled_config(cfg, o), ConfigError);  // no block 5
  o.layers = {0};
  o.method = "unif";
  o.blocks = 5;  // does not divide 24
  try {
    upcycled_config(cfg, o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe.unif.blocks"), std::string::npos);
  }
  auto moe = cfg;
  moe.model.ffn = "moe";
  o.blocks = 4;
  try {
    upcycled_config(moe, o);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.ffn"), std::string::npos);
  }
}
