// The fuzz harness of tests/reliability: cases per target (MOEFORGE_FUZZ_CASES, default 1,000),
// the seed (MOEFORGE_FUZZ_SEED), outcomes classed as success, clear error, unclear error or
// hang (> 2 s for one case), and JSON values as a hostile user writes them.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/util.h"

namespace mf::fuzz {

using json = nlohmann::json;

inline int64_t cases() {
  const char* n = std::getenv("MOEFORGE_FUZZ_CASES");
  return n ? parse_int(n, "MOEFORGE_FUZZ_CASES") : 1000;
}

struct Outcomes {
  std::map<std::string, int64_t> count;  // success, clear error, unclear error, hang
  std::vector<std::string> unclear;      // first messages of unclear errors
};

// Runs `body` on each mutated input and classes the outcome; `Clear` is the expected error type.
template <class Clear>
inline Outcomes run_cases(const std::string& target, int64_t n, const std::function<std::string(SplitMix64&)>& mutate,
                          const std::function<void(const std::string&)>& body) {
  Outcomes o;
  const char* seed = std::getenv("MOEFORGE_FUZZ_SEED");  // scripts/stress.sh: a new seed per round
  SplitMix64 rng(fnv1a64(target.data(), target.size()) ^
                 static_cast<uint64_t>(seed ? parse_int(seed, "MOEFORGE_FUZZ_SEED") : 0));
  for (int64_t i = 0; i < n; ++i) {
    const auto input = mutate(rng);
    const auto t0 = std::chrono::steady_clock::now();
    std::string outcome = "success";
    try {
      body(input);
    } catch (const Clear&) {
      outcome = "clear error";
    } catch (const std::exception& e) {
      outcome = "unclear error";
      if (o.unclear.size() < 5) o.unclear.push_back(std::string(e.what()).substr(0, 300));
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > 2.0) outcome = "hang";
    ++o.count[outcome];
  }
  std::cout << "[ fuzz ] " << target << ":";
  for (auto& [k, v] : o.count) std::cout << " " << k << " " << v;
  std::cout << "\n";
  return o;
}

inline void expect_only_success_or_clear(const Outcomes& o) {
  EXPECT_EQ(o.count.count("unclear error"), 0u) << (o.unclear.empty() ? "" : o.unclear.front());
  EXPECT_EQ(o.count.count("hang"), 0u);
  EXPECT_GT(o.count.count("clear error"), 0u);  // the mutations do reach the checks
}

inline std::string random_bytes(SplitMix64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.below(256));
  return s;
}

// Mutations of a JSON value as a hostile user would write them.
inline json weird_value(SplitMix64& rng) {
  switch (rng.below(10)) {
    case 0: return -1;
    case 1: return 1ull << 62;
    case 2: return 1.5;
    case 3: return "F32";
    case 4: return json::array({json::array({json::array({1})})});
    case 5: return nullptr;
    case 6: return json::object({{"a", 1}});
    case 7: return std::string(1000, 'x');
    case 8: return json::array();
    default: return "I32";
  }
}

}  // namespace mf::fuzz
