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

std::unique_ptr<DecodeStream> make_stream(const TransformerLM& model, int64_t max_batch, bool continuous) {
  if (!continuous) return nullptr;
  try {
    return std::make_unique<DecodeStream>(model, max_batch);
  } catch (const ConfigError& e) {
    spdlog::warn("static batches: {}", e.what());
    return nullptr;
  }
}

// The job's end: its finish reason, the rest of its text released, its handler woken.
void finish(Job& job, const std::string& error) {
  std::lock_guard<std::mutex> lock(job.m);
  if (!job.done) job.finish_reason = job.tokens >= job.opt.max_tokens ? "length" : "stop";
  job.done = true;
  job.ready = job.text.size();
  job.error = error;
  job.cv.notify_all();
}

}  // namespace

Batcher::Batcher(TransformerLM model, const Tokenizer& tokenizer, int64_t max_batch, int64_t window_ms, bool continuous)
    : model_(std::move(model)),
      tokenizer_(tokenizer),
      max_batch_(max_batch),
      window_ms_(window_ms),
      stream_(make_stream(model_, max_batch, continuous)),
      thread_([this] { loop(); }) {}

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
  if (stream_) return loop_continuous();
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

DecodeRow Batcher::row_for(Job& job) {
  Job* j = &job;
  return {j->prompt, j->opt, [this, j](int id) {
            on_token(*j, id);
            std::lock_guard<std::mutex> lock(j->m);
            return !j->done && !j->cancelled;
          }};
}

void Batcher::decode(std::vector<std::shared_ptr<Job>>& group) {
  std::vector<DecodeRow> rows;
  for (auto& job : group) rows.push_back(row_for(*job));
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
  for (auto& job : group) finish(*job, error);
}

// Waiting requests join at the next step while there is room; after a stop, the rows in flight
// decode to their end and nothing joins.
void Batcher::loop_continuous() {
  std::map<int64_t, std::shared_ptr<Job>> live;  // the stream's row ids
  for (;;) {
    std::vector<std::shared_ptr<Job>> taken;
    {
      std::unique_lock<std::mutex> lock(m_);
      if (live.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && live.empty()) return;
      while (!stopping_ && !queue_.empty() && static_cast<int64_t>(live.size() + taken.size()) < max_batch_) {
        if (!queue_.front()->cancelled) taken.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    for (auto& job : taken) {
      try {
        live[stream_->add(row_for(*job))] = job;
      } catch (const std::exception& e) {
        spdlog::error("the prompt of a request failed: {}", e.what());
        finish(*job, e.what());
      }
    }
    if (live.empty()) continue;
    std::vector<int64_t> ended;
    std::string error;
    step_tokens_ = 0;
    try {
      ended = stream_->step();
    } catch (const std::exception& e) {  // every row in flight fails; the stream starts afresh
      error = e.what();
      spdlog::error("a decode step of {} rows failed: {}", live.size(), error);
      for (auto& [id, job] : live) ended.push_back(id);
      stream_ = std::make_unique<DecodeStream>(model_, max_batch_);
    }
    {
      std::lock_guard<std::mutex> lock(m_);
      stats_.batches += taken.empty() ? 0 : 1;
      stats_.steps += 1;
      stats_.rows += static_cast<int64_t>(live.size());
      stats_.tokens += step_tokens_;
    }
    for (auto id : ended) {
      finish(*live.at(id), error);
      live.erase(id);
    }
  }
}

void Batcher::on_token(Job& job, int id) {
  ++step_tokens_;
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
