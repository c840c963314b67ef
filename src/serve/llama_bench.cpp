#include "serve/llama_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "core/util.h"
#include "io/checkpoint.h"
#include "io/gguf/export.h"
#include "io/model_io.h"

namespace mf {
namespace fs = std::filesystem;
namespace {

// A checkpoint of the model `source` names: itself, or a TOML config's random weights written to `scratch`.
std::string as_checkpoint(const std::string& source, const fs::path& scratch) {
  if (source.size() <= 5 || source.substr(source.size() - 5) != ".toml") return source;
  const auto l = load_model_or_shape(source);
  if (l.tokenizer.empty())
    throw std::runtime_error(fmt::format("no tokenizer in {} (moeforge data prepare {})", l.cfg.data.dir, source));
  const Metadata meta = step0_metadata(l.cfg, "llama");
  const auto dir = (scratch / "checkpoint").string();
  write_checkpoint(dir, {model_tensors(*l.model), {}, meta, {{"step", 0}}, l.tokenizer});
  return dir;
}

}  // namespace

nlohmann::json llama_cpp_decode(const std::string& source, const std::string& peer, int64_t prompt_len,
                                int64_t new_tokens, int threads, const std::vector<int64_t>& prefill) {
  if (peer.empty()) return {{"skipped", "--llama ''"}};
  if (!fs::is_regular_file(peer)) return {{"skipped", peer + " not found"}};
  if (!fs::is_directory(fs::path(peer).parent_path() / "node_modules/node-llama-cpp"))
    return {{"skipped", "node-llama-cpp is not installed (scripts/setup.sh)"}};
  const auto scratch = fs::temp_directory_path() / fmt::format("mf_llama_bench_{}", ::getpid());
  fs::create_directories(scratch);
  nlohmann::json out = nlohmann::json::object();
  try {
    const auto checkpoint = as_checkpoint(source, scratch);
    const auto vocab = checkpoint_config(checkpoint).model.vocab_size;
    for (const auto* dtype : {"f32", "f16", "q8_0"}) {
      const auto gguf = (scratch / fmt::format("model-{}.gguf", dtype)).string();
      gguf::export_gguf(checkpoint, gguf, {"", gguf::parse_type(dtype)});
      // llama.cpp's own threads spin on each other: at small sizes one thread can beat two (its best is kept)
      for (int t = threads; t >= 1; t = t > 1 ? 1 : 0) {
        const nlohmann::json request = {
            {"model", gguf},
            {"threads", t},
            {"bench", {{"prompt", prompt_len}, {"tokens", new_tokens}, {"vocab", vocab}, {"prefill", prefill}}}};
        write_file_atomic((scratch / "request.json").string(), request.dump());
        const auto cmd = fmt::format("node {} < {} > {}", peer, (scratch / "request.json").string(),
                                     (scratch / "response.json").string());
        if (std::system(cmd.c_str()) != 0) throw std::runtime_error("llama.cpp failed: " + cmd);
        const auto response = nlohmann::json::parse(read_file((scratch / "response.json").string()));
        const double speed = response["tokens_per_s"];
        for (auto& [length, rate] : response["prefill_tokens_per_s"].items()) {
          auto& best = out["prefill"][dtype][length];
          if (best.is_null() || rate.get<double>() > best.get<double>()) best = rate;
        }
        out[dtype + std::string("_threads_") + std::to_string(t)] = speed;
        if (!out.contains(dtype) || speed > out[dtype].get<double>())
          out[dtype] = speed, out[dtype + std::string("_threads")] = t;
      }
      fs::remove(gguf);
    }
  } catch (const std::exception& e) {
    out = {{"skipped", e.what()}};
  }
  fs::remove_all(scratch);
  return out;
}

}  // namespace mf
