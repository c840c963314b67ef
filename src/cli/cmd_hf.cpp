// Hugging Face interop: import an HF model directory as a checkpoint, export a checkpoint as one.
#include <fmt/format.h>

#include <iostream>

#include "cli/commands.h"
#include "core/runtime.h"
#include "io/hf/hf_dir.h"

namespace mf::cli {

void register_hf_commands(CLI::App& app) {
  static std::string in, out, arch, dtype = "f32", shard = "5GB";
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

  auto* exp = app.add_subcommand(
      "export",
      "write a checkpoint as a Hugging Face model directory (config.json, safetensors shards with an index, "
      "tokenizer.model) that transformers' AutoModelForCausalLM opens");
  exp->add_option("checkpoint", in, "checkpoint directory, its model.safetensors, or a run directory")->required();
  exp->add_option("-o,--out", out, "output directory (replaced)")->required();
  exp->add_option("--arch", arch,
                  "llama, mixtral, qwen2_moe, qwen3_moe or olmoe (default: from the model: dense -> llama; "
                  "qk_norm head -> qwen3_moe, full -> olmoe; shared expert -> qwen2_moe; else mixtral)");
  exp->add_option("--dtype", dtype, "f32, bf16 or f16 on disk")->capture_default_str();
  exp->add_option("--shard-size", shard, "largest shard, e.g. 5GB, 500MB")->capture_default_str();
  exp->callback([] {
    streaming_allocator();
    hf::ExportOptions o;
    o.arch = arch;
    o.dtype = hf::parse_dtype(dtype);
    o.shard_bytes = hf::parse_size(shard);
    auto r = hf::export_hf(in, out, o);
    std::cout << fmt::format("wrote {}: {} model, {} tensors, {:.1f} MB in {} shard(s)\n", out, r.arch, r.tensors,
                             r.bytes / 1e6, r.shards);
  });
}

}  // namespace mf::cli
