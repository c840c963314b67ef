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
  std::string unclear;
  for (const auto& u : o.unclear) unclear += "\n  " + u;
  EXPECT_EQ(o.count.count("unclear error"), 0u) << "the first unclear errors:" << unclear;
  EXPECT_EQ(o.count.count("hang"), 0u);
  EXPECT_GT(o.count.count("clear error"), 0u);  // the mutations do reach the checks
}

inline std::string random_bytes(SplitMix64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng.below(256));
  return s;
}

// A text cut short or with one bit flipped.
inline std::string flip_or_cut(std::string text, SplitMix64& rng) {
  if (rng.below(2)) return text.substr(0, rng.below(text.size()));
  text[rng.below(text.size())] ^= static_cast<char>(1 << rng.below(8));
  return text;
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

// A safetensors file as a hostile user edits it: bit flips, truncation, the header length,
// deep nesting, dtype / shape / offset / name edits, duplicate keys.
inline std::string mutate_safetensors(const std::string& seed, SplitMix64& rng) {
  std::string b = seed;
  const uint64_t n = static_cast<unsigned char>(b[0]) | (static_cast<uint64_t>(static_cast<unsigned char>(b[1])) << 8);
  switch (rng.below(8)) {
    case 0:  // bit flips anywhere
      for (int k = 0; k < 1 + static_cast<int>(rng.below(8)); ++k)
        b[rng.below(b.size())] ^= static_cast<char>(1 << rng.below(8));
      return b;
    case 1:  // truncation
      return b.substr(0, rng.below(b.size()));
    case 2: {  // the header length field
      const uint64_t len = rng.below(2) ? rng.next() : n + rng.below(64) - 32;
      for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((len >> (8 * i)) & 0xff);
      return b;
    }
    case 3: {  // deep nesting in place of a field
      const size_t depth = 1 + rng.below(200000);
      const auto header = json::parse(b.substr(8, n));
      const char* fields[] = {"dtype", "shape", "data_offsets"};
      const std::string text = header.dump();
      const std::string field = std::string("\"") + fields[rng.below(3)] + "\":";
      const auto at = text.find(field);
      if (at == std::string::npos) return b;
      auto edited = text.substr(0, at + field.size()) + std::string(depth, '[') + std::string(depth, ']') + "," +
                    text.substr(text.find_first_of(",}", at + field.size() + 1) + 1);
      std::string out(8, '\0');
      for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((edited.size() >> (8 * i)) & 0xff);
      return out + edited + b.substr(8 + n);
    }
    default: {  // JSON edits of dtype, shape, offsets, names, duplicates
      auto header = json::parse(b.substr(8, n));
      std::vector<std::string> names;
      for (auto& [k, v] : header.items())
        if (k != "__metadata__") names.push_back(k);
      auto& entry = header[names[rng.below(names.size())]];
      switch (rng.below(6)) {
        case 0:
          entry["dtype"] =
              rng.below(2)
                  ? weird_value(rng)
                  : json(std::vector<std::string>{"F16", "BF16", "I32", "F64", "U8", "BOOL", "I64"}[rng.below(7)]);
          break;
        case 1: entry["shape"][rng.below(std::max<size_t>(1, entry["shape"].size()))] = weird_value(rng); break;
        case 2: entry["data_offsets"][rng.below(2)] = rng.below(2) ? weird_value(rng) : json(rng.below(1 << 20)); break;
        case 3: entry["shape"].push_back(rng.below(4)); break;
        case 4: header[random_bytes(rng, 1 + rng.below(6))] = entry; break;  // a copy under a non-UTF-8 name
        default: entry.erase(std::vector<std::string>{"dtype", "shape", "data_offsets"}[rng.below(3)]); break;
      }
      std::string text;
      try {
        text = header.dump();
      } catch (const json::exception&) {  // invalid UTF-8 in a name: write it raw
        text = header.dump(-1, ' ', false, json::error_handler_t::ignore);
      }
      if (rng.below(4) == 0) {  // a duplicate key, textually
        const auto name = names.front();
        text.insert(1, "\"" + name + "\":" + header[name].dump() + ",");
      }
      std::string out(8, '\0');
      for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
      return out + text + b.substr(8 + n);
    }
  }
}

}  // namespace mf::fuzz
