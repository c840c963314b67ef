// The server's decoding thread: completions submitted from any thread are decoded by one thread
// that owns the model. Continuous batching (the default where the decode engine runs the model):
// a request joins the rows decoding at the next step, each row at its own position, and a row
// that ends frees its place at once (serve/decode_stream.h). Static batching (`--batching static`,
// and models the engine does not run): requests that wait together and have prompts of one length
// share a batch (decode_rows); one that arrives while a batch decodes waits for it.
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
#include "serve/decode_stream.h"
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
  // continuous: rows join between steps where the decode engine runs the model (else static, logged)
  Batcher(TransformerLM model, const Tokenizer& tokenizer, int64_t max_batch, int64_t window_ms,
          bool continuous = true);
  ~Batcher();
  void submit(const std::shared_ptr<Job>& job);
  void stop();  // finishes the batch in progress, fails the waiting jobs, joins
  BatcherStats stats() const;
  bool continuous() const { return stream_ != nullptr; }

 private:
  void loop();
  void loop_continuous();
  void decode(std::vector<std::shared_ptr<Job>>& group);
  DecodeRow row_for(Job& job);
  void on_token(Job& job, int id);

  TransformerLM model_;
  const Tokenizer& tokenizer_;
  int64_t max_batch_, window_ms_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  BatcherStats stats_;
  std::unique_ptr<DecodeStream> stream_;  // continuous batching; null: static batches
  int64_t step_tokens_ = 0;               // tokens picked in the current step (the decoding thread's)
  std::thread thread_;
};

}  // namespace mf
