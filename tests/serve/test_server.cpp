// The HTTP server on loopback (serve/server, serve/batcher, serve/completions): concurrent
// clients, greedy equality with generate(), bad requests, a client that leaves mid-stream.
#include <gtest/gtest.h>
#include <httplib.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "data/tokenizer.h"
#include "serve/completions.h"
#include "serve/generate.h"
#include "serve/served.h"
#include "serve/server.h"
#include "test_support.h"

namespace mf {
namespace {

nlohmann::json body(const std::string& prompt, int64_t max_tokens, bool stream = false) {
  return {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", stream}};
}

// The text of a server-sent event stream, and whether it ended with [DONE].
std::pair<std::string, bool> read_stream(const std::string& events) {
  std::string text;
  bool done = false;
  for (size_t at = 0; (at = events.find("data: ", at)) != std::string::npos;) {
    const auto end = events.find("\n\n", at);
    const auto data = events.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    text += nlohmann::json::parse(data)["choices"][0]["text"].get<std::string>();
  }
  return {text, done};
}

TEST(Completions, RequestsAreCheckedFieldByField) {
  auto r = parse_completion_request(R"({"prompt": ["hi"], "max_tokens": 3, "stop": "\n", "n": 1, "user": "u"})");
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  const auto param_of = [](const std::string& b) {
    try {
      parse_completion_request(b);
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param.empty() ? std::string("(body)") : e.param;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(param_of("{\"prompt\": \"a\""), "(body)");
  EXPECT_EQ(param_of("[1]"), "(body)");
  EXPECT_EQ(param_of(R"({"max_tokens": 3})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt": ""})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt": 5})"), "prompt");
  EXPECT_EQ(param_of(R"({"prompt": "a", "max_tokens": "3"})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt": "a", "max_tokens": -1})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt": "a", "temperature": 3})"), "temperature");
  EXPECT_EQ(param_of(R"({"prompt": "a", "top_p": 0})"), "top_p");
  EXPECT_EQ(param_of(R"({"prompt": "a", "stream": 1})"), "stream");
  EXPECT_EQ(param_of(R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})"), "stop");
  EXPECT_EQ(param_of(R"({"prompt": "a", "n": 2})"), "n");
  EXPECT_EQ(param_of(R"({"prompt": "a", "echo": false, "logprobs": null})"), "accepted");
  EXPECT_EQ(param_of(R"({"prompt": "a", "colour": "red"})"), "colour");
  // numbers beyond a double, seeds beyond int64, a NUL after the JSON: 400s, never 500s
  EXPECT_EQ(param_of(R"({"prompt": "a", "max_tokens": 1e999})"), "(body)");
  EXPECT_EQ(param_of(R"({"prompt": "a", "max_tokens": 123456789012345678901234567890})"), "max_tokens");
  EXPECT_EQ(param_of(R"({"prompt": "a", "seed": 9223372036854775808})"), "seed");
  EXPECT_EQ(param_of(R"({"prompt": "a", "seed": 18446744073709551615})"), "seed");
  EXPECT_EQ(param_of(R"({"prompt": "a", "seed": 9223372036854775807})"), "accepted");
  EXPECT_EQ(param_of(std::string(R"({"prompt": "a"})") + std::string(1, '\0')), "(body)");
}

TEST(Completions, ATinyTemperatureSamplesGreedily) {
  auto l = tiny_lm();
  Tokenizer tok(l.tokenizer);
  const auto prompt = tok.encode("Once upon a time");
  SamplingOptions greedy{12, 0.0, 1.0, 0, -1}, tiny{12, 5e-324, 1.0, 0, -1};
  EXPECT_EQ(generate(l.model, prompt, tiny), generate(l.model, prompt, greedy));
}

TEST(Completions, StopStringsCutAndHoldBack) {
  auto s = scan_stops("hello world", {"wor", "xyz"});
  EXPECT_TRUE(s.hit);
  EXPECT_EQ(s.end, 6u);
  s = scan_stops("hello wo", {"world"});  // "wo" may still become "world": hold it back
  EXPECT_FALSE(s.hit);
  EXPECT_EQ(s.end, 8u);
  EXPECT_EQ(s.keep, 2u);
  s = scan_stops("abc", {});
  EXPECT_EQ(s.end, 3u);
  EXPECT_EQ(s.keep, 0u);
}

TEST(Server, SixteenConcurrentClientsGetCompleteCorrectAnswers) {
  for (auto batching : {"continuous", "static"}) {
    SCOPED_TRACE(batching);
    Served s(1 << 20, batching);
    std::vector<std::string> prompts;
    for (int i = 0; i < 16; ++i)  // pairs of equal token length share static batches
      prompts.push_back(std::string(i % 2 ? "The cat " : "A dog ") + std::to_string(i % 4));
    std::vector<std::string> expect;
    for (auto& p : prompts) expect.push_back(s.reference(p, 12));
    std::vector<std::string> got(prompts.size());
    std::vector<int> status(prompts.size(), 0);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
      clients.emplace_back([&, i] {
        auto c = s.client();
        const bool stream = i % 3 == 0;
        auto res = c.Post("/v1/completions", body(prompts[i], 12, stream).dump(), "application/json");
        if (!res) return;
        status[i] = res->status;
        got[i] = stream ? read_stream(res->body).first
                        : nlohmann::json::parse(res->body)["choices"][0]["text"].get<std::string>();
      });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(status[i], 200) << "client " << i;
      EXPECT_EQ(got[i], expect[i]) << "client " << i << " prompt '" << prompts[i] << "'";
    }
    auto health = nlohmann::json::parse(s.client().Get("/health")->body);
    EXPECT_GT(health["tokens"].get<int64_t>(), 0);
    EXPECT_EQ(health["batching"], batching);
    std::cout << batching << ": batches " << health["batches"] << ", mean rows per step "
              << health["mean_rows_per_step"] << "\n";
  }
}

// Continuous batching: requests arriving while others decode join them at the next step (prompts
// of different lengths, sampled with their own seeds) and get what generate() gives each alone.
TEST(Server, StaggeredArrivalsGetGenerateTokensWhateverTheyShareStepsWith) {
  Served s;
  const std::vector<std::string> prompts = {"Once upon a time",        "The", "A dog ran",
                                            "In the beginning of the", "Hi",  "The cat sat on the mat and"};
  std::vector<std::string> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(40 * i));
      auto b = body(prompts[i], 24);
      b["temperature"] = 0.8, b["seed"] = 10 + i;
      auto res = s.client().Post("/v1/completions", b.dump(), "application/json");
      if (res && res->status == 200) got[i] = nlohmann::json::parse(res->body)["choices"][0]["text"].get<std::string>();
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SamplingOptions o{24, 0.8, 1.0, 10 + i, s.tok.eos_id()};
    EXPECT_EQ(got[i], s.tok.decode(generate(s.loaded.model, s.tok.encode(prompts[i]), o))) << "client " << i;
  }
}

TEST(Server, GreedyEqualsGenerateTokenForToken) {
  Served s;
  auto c = s.client();
  auto res = c.Post("/v1/completions", body("Once upon a time", 20).dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  auto j = nlohmann::json::parse(res->body);
  SamplingOptions o{20, 0.0, 1.0, 0, s.tok.eos_id()};
  const auto ids = generate(s.loaded.model, s.tok.encode("Once upon a time"), o);
  EXPECT_EQ(j["choices"][0]["text"], s.tok.decode(ids));
  EXPECT_EQ(j["usage"]["completion_tokens"].get<size_t>(), ids.size());
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), s.tok.encode("Once upon a time").size());
  EXPECT_EQ(j["choices"][0]["finish_reason"], ids.size() == 20 ? "length" : "stop");
  // a stop string cuts the text before it, and the stream sends the same text
  const auto full = j["choices"][0]["text"].get<std::string>();
  const auto cut = full.find_first_of("abcdefghijklmnopqrstuvwxyz ", 1);  // one ASCII byte after the first
  ASSERT_NE(cut, std::string::npos) << "no ASCII letter to stop at in '" << full << "'";
  auto b = body("Once upon a time", 20, true);
  b["stop"] = full.substr(cut, 1);
  auto streamed = c.Post("/v1/completions", b.dump(), "application/json");
  ASSERT_TRUE(streamed);
  auto [text, done] = read_stream(streamed->body);
  EXPECT_TRUE(done);
  EXPECT_EQ(text, full.substr(0, full.find(full.substr(cut, 1))));
  EXPECT_NE(streamed->body.find("\"finish_reason\":\"stop\""), std::string::npos);
}

TEST(Server, BadRequestsGetJsonErrorsAndTheServerKeepsServing) {
  Served s(/*max_body=*/4096);
  auto c = s.client();
  const auto expect_error = [&](const httplib::Result& res, int status, const std::string& words) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    auto j = nlohmann::json::parse(res->body);
    EXPECT_NE(j["error"]["message"].get<std::string>().find(words), std::string::npos) << res->body;
  };
  expect_error(c.Post("/v1/completions", "{not json", "application/json"), 400, "not valid JSON");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": "many"})", "application/json"), 400,
               "'max_tokens' must be an integer");
  expect_error(c.Post("/v1/completions", R"({"prompt": ""})", "application/json"), 400, "must not be empty");
  expect_error(c.Post("/v1/completions", body("hello", 100).dump(), "application/json"), 400, "context of 64");
  expect_error(c.Post("/v1/completions", R"({"prompt": "a", "model": "gpt-9"})", "application/json"), 404,
               "not served here");
  expect_error(c.Post("/v1/completions", std::string(5000, ' '), "application/json"), 413, "limit");
  {  // the same limit for a chunked body (no Content-Length), on a connection of its own
    auto chunked = s.client();
    expect_error(chunked.Post(
                     "/v1/completions",
                     [](size_t offset, httplib::DataSink& sink) {
                       if (offset >= 5000) return sink.done(), true;
                       return sink.write(std::string(1000, ' ').data(), 1000);
                     },
                     "application/json"),
                 413, "limit");
  }
  expect_error(c.Get("/v2/nothing"), 404, "no route");
  auto ok = c.Post("/v1/completions", body("hello", 3).dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto models = nlohmann::json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
}

TEST(Server, AClientLeavingMidStreamDoesNotStopTheOthers) {
  Served s;
  const auto expect = s.reference("The other client", 30);
  std::string other;
  std::thread stays([&] {
    auto c = s.client();
    auto res = c.Post("/v1/completions", body("The other client", 30, true).dump(), "application/json");
    if (res) other = read_stream(res->body).first;
  });
  {
    auto c = s.client();
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body("The leaving client", 50, true).dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };  // then hang up
    c.send(req);
    EXPECT_GE(chunks, 1);
  }
  stays.join();
  EXPECT_EQ(other, expect);
  auto again = s.client().Post("/v1/completions", body("hello", 3).dump(), "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 200);
}

}  // namespace
}  // namespace mf
