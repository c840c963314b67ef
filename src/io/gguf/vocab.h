// tokenizer.ggml.* metadata for llama.cpp from a tokenizer file (SentencePiece tokenizer.model or
// byte-level BPE tokenizer.json), padded to the model's vocabulary of `vocab` ids.
#pragma once
#include <string>

#include "io/gguf/writer.h"

namespace mf::gguf {

void write_vocab(Writer& w, const std::string& tokenizer_file, int64_t vocab);

}  // namespace mf::gguf
