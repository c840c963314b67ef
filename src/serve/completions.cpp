#include "serve/completions.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace mf {
namespace {

const char* type_name(const nlohmann::json& v) {
  return v.is_string()    ? "a string"
         : v.is_boolean() ? "a boolean"
         : v.is_number()  ? "a number"
         : v.is_null()    ? "null"
         : v.is_array()   ? "an array"
                          : "an object";
}

[[noreturn]] void bad(const std::string& field, const std::string& what) {
  throw RequestError(400, field, fmt::format("'{}' {}", field, what));
}

double number(const nlohmann::json& v, const std::string& field, double lo, double hi) {
  if (!v.is_number()) bad(field, fmt::format("must be a number, not {}", type_name(v)));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) bad(field, fmt::format("must lie in [{}, {}], got {}", lo, hi, x));
  return x;
}

int64_t integer(const nlohmann::json& v, const std::string& field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(field, fmt::format("must be an integer, not {}", type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad(field, fmt::format("must lie in [{}, {}], got {}", lo, hi, v.get<uint64_t>()));
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) bad(field, fmt::format("must lie in [{}, {}], got {}", lo, hi, x));
  return x;
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body) {
  if (body.find('\0') != std::string::npos) throw RequestError(400, "", "the body contains a NUL byte");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // parse errors, and numbers beyond a double (1e999)
    throw RequestError(400, "", fmt::format("the body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) throw RequestError(400, "", "the body must be a JSON object");
  CompletionRequest r;
  // OpenAI fields we accept only at their neutral value
  const std::map<std::string, nlohmann::json> neutral = {{"n", 1},
                                                         {"best_of", 1},
                                                         {"echo", false},
                                                         {"logprobs", nullptr},
                                                         {"presence_penalty", 0},
                                                         {"frequency_penalty", 0},
                                                         {"suffix", nullptr}};
  for (auto& [key, v] : j.items()) {
    if (key == "model") {
      if (!v.is_string()) bad(key, fmt::format("must be a string, not {}", type_name(v)));
      r.model = v.get<std::string>();
    } else if (key == "prompt") {
      if (v.is_array() && v.size() == 1 && v[0].is_string())
        r.prompt = v[0].get<std::string>();
      else if (v.is_string())
        r.prompt = v.get<std::string>();
      else
        bad(key, fmt::format("must be a string (or an array of one string), not {}", type_name(v)));
    } else if (key == "max_tokens") {
      r.max_tokens = integer(v, key, 0, 1 << 20);
    } else if (key == "temperature") {
      r.temperature = number(v, key, 0, 2);
    } else if (key == "top_p") {
      r.top_p = number(v, key, 1e-6, 1);
    } else if (key == "seed") {
      r.seed = static_cast<uint64_t>(integer(v, key, 0, INT64_MAX));
    } else if (key == "stream") {
      if (!v.is_boolean()) bad(key, fmt::format("must be a boolean, not {}", type_name(v)));
      r.stream = v.get<bool>();
    } else if (key == "stop") {
      if (v.is_string()) {
        r.stop = {v.get<std::string>()};
      } else if (v.is_array() && v.size() <= 4 &&
                 std::all_of(v.begin(), v.end(), [](auto& s) { return s.is_string(); })) {
        r.stop = v.get<std::vector<std::string>>();
      } else if (!v.is_null()) {
        bad(key, "must be a string or an array of at most 4 strings");
      }
      r.stop.erase(std::remove(r.stop.begin(), r.stop.end(), ""), r.stop.end());
    } else if (key == "user") {
      if (!v.is_string()) bad(key, fmt::format("must be a string, not {}", type_name(v)));
    } else if (auto it = neutral.find(key); it != neutral.end()) {
      if (v != it->second && !(v.is_number() && it->second.is_number() && v.get<double>() == it->second.get<double>()))
        bad(key, fmt::format("is not supported by this server except as {}", it->second.dump()));
    } else {
      throw RequestError(400, key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!j.contains("prompt")) throw RequestError(400, "prompt", "'prompt' is required");
  if (r.prompt.empty()) bad("prompt", "must not be empty");
  return r;
}

nlohmann::json error_json(int status, const std::string& message, const std::string& param) {
  const char* type = status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
            {"code", status}}}};
}

nlohmann::json completion_json(const std::string& id, int64_t created, const std::string& model,
                               const CompletionResult& r) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", {{{"index", 0}, {"text", r.text}, {"finish_reason", r.finish_reason}, {"logprobs", nullptr}}}},
          {"usage",
           {{"prompt_tokens", r.prompt_tokens},
            {"completion_tokens", r.completion_tokens},
            {"total_tokens", r.prompt_tokens + r.completion_tokens}}}};
}

nlohmann::json chunk_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                          const std::string& finish_reason) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices",
           {{{"index", 0},
             {"text", text},
             {"finish_reason", finish_reason.empty() ? nlohmann::json() : nlohmann::json(finish_reason)},
             {"logprobs", nullptr}}}}};
}

StopScan scan_stops(const std::string& text, const std::vector<std::string>& stops) {
  StopScan s{text.size(), 0, false};
  for (auto& stop : stops) {
    if (auto at = text.find(stop); at != std::string::npos && at < s.end) {
      s.end = at;
      s.hit = true;
    }
  }
  if (s.hit) return s;
  for (auto& stop : stops)  // a suffix of text that is a proper prefix of a stop string
    for (size_t n = std::min(stop.size() - 1, text.size()); n > s.keep; --n)
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        s.keep = n;
        break;
      }
  return s;
}

}  // namespace mf
