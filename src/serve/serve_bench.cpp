#include "serve/serve_bench.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "io/model_io.h"
#include "serve/server.h"

namespace mf {
namespace {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5))];
}

nlohmann::json health(int port) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/health");
  if (!res) throw std::runtime_error("bench serve: the server does not answer /health");
  return nlohmann::json::parse(res->body);
}

}  // namespace

namespace {

// One round: n clients, each `requests` completions one after another, the first after its delay.
ServeBenchRow serve_round(int port, int64_t n, int64_t requests, int64_t max_tokens, double arrivals_s) {
  const auto before = health(port);
  std::vector<std::vector<double>> latency(static_cast<size_t>(n));
  std::vector<int64_t> tokens(static_cast<size_t>(n), 0);
  std::vector<std::thread> threads;
  std::mt19937_64 rng(static_cast<uint64_t>(n));
  std::vector<double> delay_s;
  for (int64_t c = 0; c < n; ++c) delay_s.push_back(std::uniform_real_distribution<double>(0, arrivals_s)(rng));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n; ++c)
    threads.emplace_back([&, c] {
      std::this_thread::sleep_for(std::chrono::duration<double>(delay_s[static_cast<size_t>(c)]));
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(600, 0);
      for (int64_t i = 0; i < requests; ++i) {
        const nlohmann::json body = {
            {"prompt", "The history of the"}, {"max_tokens", max_tokens}, {"temperature", 0.8}, {"seed", c * 1000 + i}};
        const auto s = std::chrono::steady_clock::now();
        auto res = client.Post("/v1/completions", body.dump(), "application/json");
        if (!res || res->status != 200) continue;
        latency[static_cast<size_t>(c)].push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
        tokens[static_cast<size_t>(c)] += nlohmann::json::parse(res->body)["usage"]["completion_tokens"].get<int64_t>();
      }
    });
  for (auto& t : threads) t.join();
  ServeBenchRow r;
  r.clients = n;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all;
  for (size_t c = 0; c < latency.size(); ++c) {
    all.insert(all.end(), latency[c].begin(), latency[c].end());
    r.tokens += tokens[c];
  }
  r.requests = static_cast<int64_t>(all.size());
  r.tokens_per_s = static_cast<double>(r.tokens) / r.seconds;
  r.p50_ms = percentile(all, 0.5);
  r.p95_ms = percentile(all, 0.95);
  const auto after = health(port);
  const double steps = after["steps"].get<double>() - before["steps"].get<double>();
  r.rows_per_step = steps > 0 ? (after["tokens"].get<double>() - before["tokens"].get<double>()) / steps : 0;
  r.batching = after["batching"].get<std::string>();
  return r;
}

}  // namespace

std::vector<ServeBenchRow> bench_serve(const std::string& source, const std::vector<int64_t>& clients, int64_t requests,
                                       int64_t max_tokens, double arrivals_s,
                                       const std::vector<std::string>& batchings) {
  auto loaded = load_model_or_shape(source);
  if (loaded.tokenizer.empty())
    throw std::runtime_error(loaded.cfg.data.dir + " has no tokenizer: run `moeforge data prepare " + source +
                             "` first");
  std::vector<ServeBenchRow> rows;
  for (const auto& batching : batchings) {
    ServeOptions opt;
    opt.port = 0;
    opt.max_batch = *std::max_element(clients.begin(), clients.end());
    opt.batching = batching;
    CompletionServer server(loaded, opt);
    std::thread serving([&] { server.run(); });
    try {
      serve_round(server.port(), 1, 1, max_tokens, 0);  // warm-up: the first request pays for threads and pages
      for (int64_t n : clients) rows.push_back(serve_round(server.port(), n, requests, max_tokens, arrivals_s));
    } catch (...) {
      server.stop();
      serving.join();
      throw;
    }
    server.stop();
    serving.join();
  }
  return rows;
}

ResultTable serve_bench_table(const std::vector<ServeBenchRow>& rows) {
  ResultTable t({{"batching", "batching", "", -11},
                 {"clients", "clients", "", 7},
                 {"requests", "requests", "", 9},
                 {"tokens", "tokens", "", 8},
                 {"tokens_per_s", "tokens/s", "{:.1f}", 10},
                 {"p50_ms", "p50 ms", "{:.0f}", 9},
                 {"p95_ms", "p95 ms", "{:.0f}", 9},
                 {"rows_per_step", "rows per step", "{:.2f}", 14}});
  for (const auto& r : rows)
    t.add({{"batching", r.batching},
           {"clients", r.clients},
           {"requests", r.requests},
           {"tokens", r.tokens},
           {"tokens_per_s", r.tokens_per_s},
           {"p50_ms", r.p50_ms},
           {"p95_ms", r.p95_ms},
           {"rows_per_step", r.rows_per_step}});
  return t;
}

}  // namespace mf
