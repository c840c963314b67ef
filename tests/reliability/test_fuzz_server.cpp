// Fuzzing `moeforge serve` over loopback HTTP with mutated completion requests: every answer
// must be a 200, or a 4xx whose JSON error names what is wrong; a 5xx, a body that is not that
// JSON, no answer, or one taking over 2 s is a failure. MOEFORGE_FUZZ_CASES / 5 cases (a valid
// request decodes, so these cost more than the file fuzzers' cases).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "reliability/fuzz.h"
#include "serve/served.h"

using namespace mf;
using namespace mf::fuzz;

namespace {

struct ClearReply : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json kRequest = {{"prompt", "Hello there"}, {"max_tokens", 3}, {"temperature", 0.7}, {"top_p", 0.9}, {"seed", 11},
                       {"stop", {"\n"}},          {"stream", false}, {"model", "tiny"}};

// Numbers and texts JSON parsers and samplers get wrong, written into the body as text.
std::string hostile_literal(SplitMix64& rng) {
  const char* literals[] = {"1e999",
                            "-1e999",
                            "123456789012345678901234567890",
                            "5e-324",
                            "9223372036854775808",
                            "18446744073709551615",
                            "-0.0",
                            "1e-7",
                            "0.99999999999999999",
                            "true",
                            "null",
                            "[]",
                            "{}",
                            "\"\\u0000\"",
                            "\"\\ud800\"",
                            "-9223372036854775809",
                            "64",
                            "65",
                            "0",
                            "-1"};
  return literals[rng.below(sizeof(literals) / sizeof(*literals))];
}

std::string mutate_request(SplitMix64& rng) {
  json j = kRequest;
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  const auto key = keys[rng.below(keys.size())];
  switch (rng.below(8)) {
    case 0: j[key] = weird_value(rng); break;
    case 1: j.erase(key); break;
    case 2: j[random_bytes(rng, 1 + rng.below(8))] = weird_value(rng); break;
    case 3: j["stream"] = true; break;
    case 4: {  // a hostile literal in place of one value, as text
      const std::string marker = "\"@@\"";
      j[key] = "@@";
      std::string text = j.dump();
      return text.replace(text.find(marker), marker.size(), hostile_literal(rng));
    }
    case 5: {  // bytes: flips, truncation, a NUL or garbage after the JSON
      std::string text = j.dump();
      if (rng.below(3) == 0) return text + std::string(1, '\0') + random_bytes(rng, rng.below(4));
      if (rng.below(2)) return text.substr(0, rng.below(text.size()));
      text[rng.below(text.size())] ^= static_cast<char>(1 << rng.below(8));
      return text;
    }
    case 6: return std::string(1 + rng.below(5000), '[') + std::string(rng.below(5000), ']');
    default: j["prompt"] = random_bytes(rng, 1 + rng.below(40)); break;  // invalid UTF-8 mostly
  }
  return j.dump(-1, ' ', false, json::error_handler_t::ignore);
}

TEST(Fuzz, RequestBodiesGetAnAnswerOrANamedError) {
  Served s(/*max_body=*/1 << 16);
  auto c = s.client();
  c.set_read_timeout(10, 0);
  const auto o =
      run_cases<ClearReply>("serve", std::max<int64_t>(1, cases() / 5), mutate_request, [&](const std::string& body) {
        auto res = c.Post("/v1/completions", body, "application/json");
        if (!res) throw std::runtime_error("no answer: " + httplib::to_string(res.error()));
        if (res->status == 200) return;
        std::string message;
        try {
          message = json::parse(res->body).at("error").at("message").get<std::string>();
        } catch (const std::exception&) {
          throw std::runtime_error(fmt::format("HTTP {} without a JSON error: {}", res->status, res->body));
        }
        if (res->status < 400 || res->status >= 500)
          throw std::runtime_error(fmt::format("HTTP {}: {}", res->status, message));
        throw ClearReply(message);
      });
  expect_only_success_or_clear(o);
  EXPECT_GT(o.count.count("success"), 0u);  // the mutations leave some requests valid
}

}  // namespace
