#include "serve/batcher.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>

#include "serve/completions.h"

namespace mf {
namespace {

// Bytes of `s` up to the end of its last complete UTF-8 character, and short of a trailing
// U+FFFD, which a byte-level tokenizer shows for a character whose bytes have not all come.
size_t complete_utf8(const std::string& s) {
  size_t n = s.size();
  size_t i = n;
  while (i > 0 && n - i < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i > 0) {
    const auto lead = static_cast<unsigned char>(s[i - 1]);
    const size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < need) n = i - 1;
  }
  if (n >= 3 && s.compare(n - 3, 3, "\xEF\xBF\xBD") == 0) n -= 3;
  return n;
}

}  // namespace

Batcher::Batcher(TransformerLM model, const Tokenizer& tokenizer, int64_t max_batch, int64_t window_ms)
    : model_(std::move(model)), tokenizer_(tokenizer), max_batch_(max_batch), window_ms_(window_ms), thread_([this] {
        loop();
      }) {}

Batcher::~Batcher() { stop(); }

void Batcher::submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (stopping_) throw std::runtime_error("the server is shutting down");
    queue_.push_back(job);
  }
  cv_.notify_one();
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& job : queue_) {
    std::lock_guard<std::mutex> lock(job->m);
    job->error = "the server shut down before this request was decoded";
    job->done = true;
    job->cv.notify_all();
  }
  queue_.clear();
}

BatcherStats Batcher::stats() const {
  std::lock_guard<std::mutex> lock(m_);
  return stats_;
}

void Batcher::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> taken;
    {
      std::unique_lock<std::mutex> lock(m_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      // Clients that connect together arrive a little apart: wait a moment for company.
      cv_.wait_for(lock, std::chrono::milliseconds(window_ms_),
                   [&] { return stopping_ || static_cast<int64_t>(queue_.size()) >= max_batch_; });
      while (!queue_.empty() && static_cast<int64_t>(taken.size()) < max_batch_) {
        if (!queue_.front()->cancelled) taken.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    std::map<size_t, std::vector<std::shared_ptr<Job>>> by_length;
    for (auto& job : taken) by_length[job->prompt.size()].push_back(job);
    for (auto& [length, group] : by_length) decode(group);
  }
}

void Batcher::decode(std::vector<std::shared_ptr<Job>>& group) {
  std::vector<DecodeRow> rows;
  for (auto& job : group) {
    Job* j = job.get();
    rows.push_back({j->prompt, j->opt, [this, j](int id) {
                      on_token(*j, id);
                      std::lock_guard<std::mutex> lock(j->m);
                      return !j->done && !j->cancelled;
                    }});
  }
  std::string error;
  try {
    decode_rows(model_, rows);
  } catch (const std::exception& e) {
    error = e.what();
    spdlog::error("decoding a batch of {} failed: {}", group.size(), error);
  }
  int64_t longest = 0, tokens = 0;
  for (auto& job : group) {
    std::lock_guard<std::mutex> lock(job->m);
    longest = std::max(longest, job->tokens);
    tokens += job->tokens;
  }
  {  // the statistics first: a client that has its answer then sees them in /health
    std::lock_guard<std::mutex> lock(m_);
    stats_.batches += 1;
    stats_.steps += longest;
    stats_.rows += static_cast<int64_t>(group.size());
    stats_.tokens += tokens;
  }
  for (auto& job : group) {
    std::lock_guard<std::mutex> lock(job->m);
    if (!job->done) job->finish_reason = job->tokens >= job->opt.max_tokens ? "length" : "stop";
    job->done = true;
    job->ready = job->text.size();
    job->error = error;
    job->cv.notify_all();
  }
}

void Batcher::on_token(Job& job, int id) {
  std::lock_guard<std::mutex> lock(job.m);
  job.ids.push_back(id);
  job.tokens += 1;
  const auto text = tokenizer_.decode(job.ids);
  const auto scan = scan_stops(text, job.stops);
  job.text = text.substr(0, scan.end);
  if (scan.hit) {  // the stop string and what follows are never sent
    job.done = true;
    job.finish_reason = "stop";
    job.ready = job.text.size();
  } else {
    job.ready = std::max(job.ready, std::min(complete_utf8(job.text), job.text.size() - scan.keep));
  }
  job.cv.notify_all();
}

}  // namespace mf
