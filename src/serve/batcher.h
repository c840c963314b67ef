// The server's decoding thread: completions submitted from any thread are decoded in batches
// (decode_rows) by one thread that owns the model. Requests that wait together and have prompts
// of one length share a batch and a KV cache; a row that finishes leaves its batch at once.
// Not continuous batching: a request that arrives while a batch decodes waits for it, because
// the attention takes one position offset per batch (docs/benchmarks.md, serving).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "data/tokenizer.h"
#include "serve/generate.h"

namespace mf {

// One completion in flight: written by the decoding thread, read by its HTTP handler.
struct Job {
  std::vector<int> prompt;
  SamplingOptions opt;
  std::vector<std::string> stops;
  std::atomic<bool> cancelled{false};  // the client went away: the row ends at its next token

  std::mutex m;
  std::condition_variable cv;
  std::string text;  // the completion so far, cut before a stop string
  size_t ready = 0;  // bytes of text that are final (no half UTF-8 character or stop string)
  bool done = false;
  std::string finish_reason;  // "stop" or "length"
  std::string error;          // set when decoding failed
  int64_t tokens = 0;
  std::vector<int> ids;  // every generated id (text decodes them)
};

struct BatcherStats {
  int64_t batches = 0, steps = 0, rows = 0, tokens = 0;  // rows summed over steps: rows / steps = mean batch
};

class Batcher {
 public:
  // window_ms: how long the first waiting request waits for others to share its batch
  Batcher(TransformerLM model, const Tokenizer& tokenizer, int64_t max_batch, int64_t window_ms);
  ~Batcher();
  void submit(const std::shared_ptr<Job>& job);
  void stop();  // finishes the batch in progress, fails the waiting jobs, joins
  BatcherStats stats() const;

 private:
  void loop();
  void decode(std::vector<std::shared_ptr<Job>>& group);
  void on_token(Job& job, int id);

  TransformerLM model_;
  const Tokenizer& tokenizer_;
  int64_t max_batch_, window_ms_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  BatcherStats stats_;
  std::thread thread_;
};

}  // namespace mf
