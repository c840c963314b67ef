// Hugging Face model directories for tests: the Python reference's tiny models
// (tests/io/hf_reference.py, Debian's python3-torch) with config.json overrides, and a small
// SentencePiece tokenizer of ours to put beside them.
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"

#include "test_support.h"

namespace mf::hf_fixture {

using test::source_dir;

// The message of what `f` throws; "" when it throws nothing.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A fresh directory of this test (ctest runs tests in parallel processes).
inline std::filesystem::path scratch(const std::string& tag) {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() / fmt::format("mf_{}_{}_{}", ::getpid(), test->name(), tag);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The reference's tiny model of `arch` in `dir`, config.json keys overridden by `sets` (KEY=JSON);
// `extra`: more hf_reference.py flags (--vocab N --tokenizer DIR).
inline std::string tiny_model(const std::filesystem::path& dir, const std::string& arch,
                              const std::vector<std::string>& sets, const std::string& extra = "") {
  std::string cmd = fmt::format("/usr/bin/python3 {}/tests/io/hf_reference.py --arch {} --out {} --no-reference {}",
                                source_dir(), arch, dir.string(), extra);
  for (auto& s : sets) cmd += " --set '" + s + "'";
  if (std::system(cmd.c_str()) != 0)
    throw std::runtime_error("the Python reference failed (needs Debian's python3-torch; scripts/setup.sh): " + cmd);
  return dir.string();
}

// A SentencePiece model of ours (BPE, byte fallback, 400 pieces) trained on the README, as
// `dir`/tokenizer.model.
inline std::string spm_tokenizer(const std::filesystem::path& dir) {
  std::string sample;
  std::ifstream in(source_dir() + "/README.md");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) sample += line + "\n";
  const auto path = (dir / "tokenizer.model").string();
  train_tokenizer(sample, path, 400, (dir / "spm.log").string());
  return path;
}

}  // namespace mf::hf_fixture
