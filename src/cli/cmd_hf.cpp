// Hugging Face interop: import an HF model directory as a checkpoint, export a checkpoint as one;
// tokenize with a checkpoint's or directory's tokenizer.
#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <iterator>

#include "cli/commands.h"
#include "core/runtime.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/gguf/export.h"
#include "io/hf/hf_dir.h"
#include "io/model_io.h"

namespace mf::cli {

namespace {

// the tokenizer file of a checkpoint, run, corpus or Hugging Face directory, or the file itself
std::string tokenizer_of(const std::string& source) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(source)) return source;
  if (const auto direct = tokenizer_in(source); !direct.empty()) return direct;  // HF or corpus directory, checkpoint
  if (hf::is_hf_dir(source)) throw FormatError(source + ": no tokenizer.model or tokenizer.json");
  return model_tokenizer(source);
}

void add_import(CLI::App& app) {
  static std::string in, out;
  auto* imp = app.add_subcommand(
      "import",
      "read a Hugging Face model directory (config.json + model.safetensors or shards; Mixtral, Qwen2-MoE, "
      "Qwen3-MoE, OLMoE, LLaMA) into a moeforge checkpoint (float32) that eval, generate, info, usage, saliency and "
      "umoe take");
  imp->add_option("hf_dir", in, "Hugging Face model directory")->required()->check(CLI::ExistingDirectory);
  imp->add_option("-o,--out", out, "output checkpoint directory")->required();
  imp->callback([] {
    streaming_allocator();
    auto r = hf::import_hf(in, out);
    std::cout << fmt::format("wrote {}: {} model, {} parameters from {} Hugging Face tensors\n", out, r.arch,
                             r.parameters, r.tensors_read);
  });
}

void add_tokenize(CLI::App& app) {
  static std::string source, text;
  static std::vector<int> decode_ids;
  static bool pieces = false;
  auto* tk = app.add_subcommand(
      "tokenize",
      "text -> token ids (or ids -> text with --decode) with the tokenizer of a checkpoint, run, "
      "prepared corpus or Hugging Face directory (SentencePiece tokenizer.model or byte-level BPE tokenizer.json)");
  tk->add_option("source", source,
                 "checkpoint, run or corpus directory, HF model directory, or a tokenizer.model / tokenizer.json")
      ->required();
  tk->add_option("text", text, "text to encode (default: standard input)");
  static auto* decode = tk->add_option("--decode", decode_ids, "token ids to decode instead (none: the empty text)")
                            ->expected(0, CLI::detail::expected_max_vector_size);
  tk->add_flag("--pieces", pieces, "also print each id's text");
  tk->callback([] {
    Tokenizer tok(tokenizer_of(source));
    if (decode->count() > 0) {  // with no ids CLI11 leaves a value-less entry: the empty text
      std::cout << (decode->results().empty() || decode->results()[0].empty() ? "" : tok.decode(decode_ids)) << "\n";
      return;
    }
    if (text.empty()) text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    const auto ids = tok.encode(text);
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
    if (pieces)
      for (int id : ids) std::cout << fmt::format("{:>8} {:?}\n", id, tok.decode({id}));
    spdlog::info("{} tokens for {} bytes (vocabulary {})", ids.size(), text.size(), tok.vocab_size());
  });
}

void add_export(CLI::App& app) {
  static std::string in, out, arch, dtype = "f32", shard = "5GB", format = "hf";
  auto* exp = app.add_subcommand(
      "export",
      "write a checkpoint as a Hugging Face model directory (config.json, safetensors shards with an index, "
      "tokenizer.model) that transformers' AutoModelForCausalLM opens, (--format gguf) a GGUF file llama.cpp runs, "
      "or (--format checkpoint) gather a checkpoint that ranks wrote in shards into a checkpoint of single files");
  exp->add_option("checkpoint", in,
                  "checkpoint directory, its model.safetensors, or a run directory (--format gguf: also a Hugging "
                  "Face model directory)")
      ->required();
  exp->add_option("-o,--out", out, "output directory (replaced); --format gguf: the .gguf file")->required();
  exp->add_option("--arch", arch,
                  "llama, mixtral, qwen2_moe, qwen3_moe or olmoe (default: from the model: dense -> llama; "
                  "qk_norm head -> qwen3_moe, full -> olmoe; shared expert -> qwen2_moe; else mixtral)");
  exp->add_option("--dtype", dtype, "f32, bf16 or f16 on disk; --format gguf: f32, f16 or q8_0")->capture_default_str();
  exp->add_option("--shard-size", shard, "largest shard, e.g. 5GB, 500MB")->capture_default_str();
  exp->add_option("--format", format,
                  "hf: a Hugging Face directory; checkpoint: our checkpoint layout with single model.safetensors and "
                  "optimizer.safetensors files (trainer state and tokenizer copied), resumable at any world size; "
                  "gguf: one GGUF file for llama.cpp (llama for dense and Mixtral-style models, qwen2moe, qwen3moe, "
                  "olmoe), with the tokenizer; norms and routers stay f32")
      ->check(CLI::IsMember({"hf", "checkpoint", "gguf"}))
      ->capture_default_str();
  exp->callback([] {
    streaming_allocator();
    if (format == "checkpoint") {
      const auto n = gather_checkpoint(in, out);
      std::cout << fmt::format("wrote {}: {} tensors in single files\n", out, n);
      return;
    }
    if (format == "gguf") {
      const auto r = gguf::export_gguf(in, out, {arch, gguf::parse_type(dtype)});
      std::cout << fmt::format(
          "wrote {}: llama.cpp {} model, {} tensors, {:.1f} MB{}{}\n", out, r.arch, r.tensors, r.bytes / 1e6,
          r.tokenizer ? "" : " (no tokenizer: llama.cpp needs one to load it)",
          r.f16_fallbacks ? fmt::format(", {} matrices in f16 (rows not a multiple of 32)", r.f16_fallbacks) : "");
      return;
    }
    hf::ExportOptions o;
    o.arch = arch;
    o.dtype = hf::parse_dtype(dtype);
    o.shard_bytes = hf::parse_size(shard);
    auto r = hf::export_hf(in, out, o);
    std::cout << fmt::format("wrote {}: {} model, {} tensors, {:.1f} MB in {} shard(s)\n", out, r.arch, r.tensors,
                             r.bytes / 1e6, r.shards);
  });
}

}  // namespace

void register_hf_commands(CLI::App& app) {
  add_import(app);
  add_tokenize(app);
  add_export(app);
}

}  // namespace mf::cli
