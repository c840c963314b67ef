// `moeforge serve`: an HTTP server (cpp-httplib) for a trained language model with the
// OpenAI-compatible POST /v1/completions (streaming as server-sent events), GET /v1/models and
// GET /health. Bad requests get a JSON error with a 4xx status; the decoding is batched across
// concurrent clients (serve/batcher.h). Every response closes its connection (no keep-alive).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "io/model_io.h"

namespace mf {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port (see CompletionServer::port)
  int max_connections = 256;            // served at once, a thread each; more wait for a thread
  int64_t max_batch = 16;               // rows decoded together
  int64_t batch_window_ms = 5;          // static batching: a request waits this long for others to batch with
  std::string batching = "continuous";  // or "static" (serve/batcher.h)
  size_t max_body = 1 << 20;            // bytes; a larger request gets 413
  std::string model_name;               // "" = the run name
};

class CompletionServer {
 public:
  CompletionServer(LoadedModel model, const ServeOptions& opt);
  ~CompletionServer();
  int port() const;  // the bound port, once constructed
  void run();        // serves until stop(); returns when in-flight requests are answered
  void stop();       // thread-safe; also called on SIGTERM / SIGINT by serve_until_signal
  struct State;      // the model, tokenizer, batcher and HTTP server (server.cpp)

 private:
  std::unique_ptr<State> s_;
};

// Serves until SIGTERM or SIGINT, then stops gracefully: no new connections, the requests in
// flight are answered, the process exits 0; connections still open `grace_s` seconds after the
// signal (a client sending its request a byte at a time) are dropped by exiting.
void serve_until_signal(CompletionServer& server, double grace_s = 10);

}  // namespace mf
