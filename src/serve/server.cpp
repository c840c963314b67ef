#include "serve/server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <thread>
#include <vector>

#include "serve/batcher.h"
#include "serve/completions.h"

namespace mf {

struct CompletionServer::State {
  LoadedModel loaded;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Batcher> batcher;
  httplib::Server http;
  std::string name;
  size_t max_body = 0;
  size_t token_bytes = 0;  // the most bytes of a prompt one token stands for
  int listener = -1;       // the listening socket
  int port = 0;
  std::atomic<int64_t> next_id{1};
};

namespace {

// A thread per connection, started as connections arrive and kept for later ones, up to `most`;
// beyond that a connection waits for a thread. httplib's own pool is a fixed 32 threads, which
// 32 clients dribbling their headers a byte at a time (each read has its own timeout) hold.
class ConnectionThreads : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t most) : most_(most) {}
  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(m_);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() > idle_ && threads_.size() < most_)  // an idle thread takes one job each
      threads_.emplace_back([this] { work(); });
    else
      cv_.notify_one();
  }
  void shutdown() override {  // httplib calls this after its accept loop, so no enqueue races it
    {
      std::lock_guard<std::mutex> lock(m_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
  const size_t most_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

// The most bytes of a prompt one token of `tok` can stand for: its longest decoded token, plus a
// space that decoding drops at the start of a text, times 3 since normalising can shrink text
// that much (NFC of Hangul jamo: 9 bytes to 3).
size_t prompt_bytes_per_token(const Tokenizer& tok) {
  size_t most = 0;
  for (int id = 0; id < tok.vocab_size(); ++id) most = std::max(most, tok.decode({id}).size());
  return 3 * (most + 1);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "") {
  send_json(res, status, error_json(status, message, param));
}

// A byte-level tokenizer may end a completion inside a character: such bytes go out as U+FFFD.
std::string sse(const nlohmann::json& data) {
  return "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

// Streams a job's text as it becomes final; the releaser cancels the job if the client left.
void stream_job(httplib::Response& res, const std::shared_ptr<Job>& job, const std::string& id,
                const std::string& model) {
  const int64_t created = unix_now();
  auto sent = std::make_shared<size_t>(0);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, sent, id, model, created](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lock(job->m);
        job->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return job->done || job->ready > *sent; });
        std::string out;
        if (job->ready > *sent) {
          out += sse(chunk_json(id, created, model, job->text.substr(*sent, job->ready - *sent), ""));
          *sent = job->ready;
        }
        const bool finished = job->done && *sent == job->text.size();
        if (finished)
          out += job->error.empty() ? sse(chunk_json(id, created, model, "", job->finish_reason))
                                    : sse(error_json(500, job->error));
        lock.unlock();
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          job->cancelled = true;
          return false;
        }
        if (!finished && !sink.is_writable()) {
          job->cancelled = true;
          return false;
        }
        if (finished) {
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
        }
        return true;
      },
      [job](bool success) {
        if (!success) job->cancelled = true;
      });
}

void handle_completion(CompletionServer::State& s, const httplib::Request& req, const std::string& body,
                       httplib::Response& res) {
  CompletionRequest r;
  try {
    r = parse_completion_request(body);
  } catch (const RequestError& e) {
    return send_error(res, e.status, e.what(), e.param);
  }
  if (!r.model.empty() && r.model != s.name)
    return send_error(res, 404, fmt::format("model '{}' is not served here (this server has '{}')", r.model, s.name),
                      "model");
  const int64_t context = s.loaded.cfg.model.max_seq_len;
  // Refused before tokenizing: 20 concurrent 200 kB prompts to a 64-token model once cost 1 GB
  // of tokenizer memory that the allocator kept.
  if (r.prompt.size() > s.token_bytes * static_cast<size_t>(context))
    return send_error(res, 400,
                      fmt::format("the prompt ({} bytes) cannot fit the model's context of {} tokens (a token stands "
                                  "for at most {} bytes)",
                                  r.prompt.size(), context, s.token_bytes),
                      "prompt");
  auto job = std::make_shared<Job>();
  job->prompt = s.tokenizer->encode(r.prompt);
  const auto prompt_tokens = static_cast<int64_t>(job->prompt.size());
  if (prompt_tokens + r.max_tokens > context)
    return send_error(res, 400,
                      fmt::format("the prompt ({} tokens) plus max_tokens ({}) exceed the model's context of {} tokens",
                                  prompt_tokens, r.max_tokens, context),
                      "max_tokens");
  job->opt = {r.max_tokens, r.temperature, r.top_p, r.seed, s.tokenizer->eos_id()};
  job->stops = r.stop;
  const auto id = fmt::format("cmpl-{}", s.next_id++);
  try {
    s.batcher->submit(job);
  } catch (const std::runtime_error& e) {
    return send_error(res, 503, e.what());
  }
  if (r.stream) return stream_job(res, job, id, s.name);
  std::unique_lock<std::mutex> lock(job->m);
  job->cv.wait(lock, [&] { return job->done; });
  if (!job->error.empty()) return send_error(res, 500, job->error);
  send_json(res, 200,
            completion_json(id, unix_now(), s.name, {job->text, job->finish_reason, prompt_tokens, job->tokens}));
}

}  // namespace

CompletionServer::CompletionServer(LoadedModel model, const ServeOptions& opt) : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.loaded = std::move(model);
  if (s.loaded.tokenizer.empty()) throw std::runtime_error("the model has no tokenizer file beside it to serve text");
  s.tokenizer = std::make_unique<Tokenizer>(s.loaded.tokenizer);
  s.token_bytes = prompt_bytes_per_token(*s.tokenizer);
  s.name = opt.model_name.empty() ? s.loaded.cfg.run.name : opt.model_name;
  s.batcher = std::make_unique<Batcher>(s.loaded.model, *s.tokenizer, opt.max_batch, opt.batch_window_ms,
                                        opt.batching == "continuous");
  const auto connections = static_cast<size_t>(opt.max_connections);
  s.http.new_task_queue = [connections] { return new ConnectionThreads(connections); };
  // One request per connection: httplib 0.11 reads ahead into a buffer it drops after each
  // request, so pipelined requests would get no answer; closing tells the client to send them again.
  s.http.set_keep_alive_max_count(1);
  s.http.set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    s_->listener = sock;
  });
  s.http.set_payload_max_length(opt.max_body);
  s.http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const auto st = s_->batcher->stats();
    send_json(
        res, 200,
        {{"status", "ok"},
         {"model", s_->name},
         {"batches", st.batches},
         {"tokens", st.tokens},
         {"steps", st.steps},
         {"batching", s_->batcher->continuous() ? "continuous" : "static"},
         {"mean_rows_per_step", st.steps ? static_cast<double>(st.tokens) / static_cast<double>(st.steps) : 0.0}});
  });
  s.http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data",
                {{{"id", s_->name},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "moeforge"},
                  {"context_length", s_->loaded.cfg.model.max_seq_len}}}}});
  });
  // The body is read here, not by httplib: its limit covers a Content-Length only, so a chunked
  // body would otherwise grow without bound.
  s.max_body = opt.max_body;
  s.http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                        const httplib::ContentReader& read) {
    std::string body;
    bool over = false;
    const bool whole = read([&](const char* data, size_t n) {
      over = body.size() + n > s_->max_body;
      if (!over) body.append(data, n);
      return !over;
    });
    over = over || res.status == 413;  // httplib's own check of a Content-Length
    if (whole && !over) return handle_completion(*s_, req, body, res);
    res.set_header("Connection", "close");
    if (!over) return send_error(res, 400, "the request body could not be read to its end");
    send_error(res, 413, fmt::format("the request body exceeds the server's limit of {} bytes", s_->max_body));
  });
  s.http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    const auto message = res.status == 413   ? "the request body exceeds the server's limit"
                         : res.status == 404 ? fmt::format("no route {} {}", req.method, req.path)
                                             : fmt::format("HTTP {}", res.status);
    send_error(res, res.status, message);
  });
  s.http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {}
    send_error(res, 500, what);
  });
  s.port =
      opt.port == 0 ? s.http.bind_to_any_port(opt.host) : (s.http.bind_to_port(opt.host, opt.port) ? opt.port : -1);
  if (s.port < 0)
    throw std::runtime_error(
        fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)", opt.host, opt.port));
  // httplib 0.11 listens with a backlog of 5: a burst of connections waited 1 s for SYN retries.
  if (s.listener >= 0) ::listen(s.listener, SOMAXCONN);
}

CompletionServer::~CompletionServer() {
  stop();
  if (s_->batcher) s_->batcher->stop();
}

int CompletionServer::port() const { return s_->port; }

void CompletionServer::run() {
  s_->http.listen_after_bind();  // returns after stop(), once the handlers in flight are done
  s_->batcher->stop();
  const auto st = s_->batcher->stats();
  spdlog::info("served {} tokens in {} batches (mean {:.2f} rows per step)", st.tokens, st.batches,
               st.steps ? static_cast<double>(st.tokens) / static_cast<double>(st.steps) : 0.0);
}

void CompletionServer::stop() { s_->http.stop(); }

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }
}  // namespace

void serve_until_signal(CompletionServer& server, double grace_s) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::atomic<bool> served{false};
  std::thread watcher([&] {  // a signal handler may not call stop(): this thread does
    while (!served && g_stop_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (served) return;
    spdlog::info("{}: finishing the requests in flight (up to {} s), then stopping",
                 g_stop_signal == SIGTERM ? "SIGTERM" : "SIGINT", grace_s);
    server.stop();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    while (!served && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (served) return;
    spdlog::warn("connections still open {} s after the signal (a slow client?): exiting without them", grace_s);
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(0);  // nothing is written to disk by the server, so there is nothing to finish
  });
  server.run();
  served = true;
  watcher.join();
}

}  // namespace mf
