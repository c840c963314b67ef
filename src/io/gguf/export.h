// `moeforge export SOURCE --format gguf -o FILE.gguf`: a checkpoint of ours or a Hugging Face
// directory as a GGUF file llama.cpp runs (architectures and names: io/gguf/arch.h; tokenizer:
// io/gguf/vocab.h). Streamed: one of our tensors (one block's stacked experts at most) is in
// memory at a time; the file appears only when complete.
#pragma once
#include <string>

#include "io/gguf/writer.h"

namespace mf::gguf {

struct ExportOptions {
  std::string arch;        // Hugging Face model_type; "" = by the model's flags (as export --format hf)
  Type dtype = Type::F32;  // f32 | f16 | q8_0 for the matrices (see storage())
};
struct ExportReport {
  std::string arch;                                   // llama.cpp's
  int64_t tensors = 0, bytes = 0, f16_fallbacks = 0;  // q8_0 matrices whose rows are not a multiple of 32
  bool tokenizer = false;
};
ExportReport export_gguf(const std::string& source, const std::string& out, const ExportOptions& opt);

Type parse_type(const std::string& name);  // f32 | f16 | q8_0 (ConfigError otherwise)

}  // namespace mf::gguf
