// The OpenAI-compatible /v1/completions request and response bodies, apart from HTTP: parse
// and validate a request (each problem named by its field, as a 400 would carry it) and build
// the JSON of a completion or of one streamed chunk.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace mf {

// A bad request: `status` is the HTTP status to answer with, `param` the offending field.
struct RequestError : std::runtime_error {
  RequestError(int status, const std::string& param, const std::string& message)
      : std::runtime_error(message), status(status), param(param) {}
  int status;
  std::string param;
};

struct CompletionRequest {
  std::string model, prompt;
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // up to 4
  bool stream = false;
};

// Throws RequestError for malformed JSON, a field of the wrong type or range, an unknown
// field, or an empty prompt. Fields OpenAI defines that we do not implement are accepted only
// at their neutral value (n = 1, echo = false, logprobs = null, penalties = 0, best_of = 1).
CompletionRequest parse_completion_request(const std::string& body);

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_json(int status, const std::string& message, const std::string& param = "");

struct CompletionResult {
  std::string text, finish_reason;  // "stop" (stop token or string) or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json completion_json(const std::string& id, int64_t created, const std::string& model,
                               const CompletionResult& r);
// One server-sent event's data: a text piece, or the final chunk with its finish reason.
nlohmann::json chunk_json(const std::string& id, int64_t created, const std::string& model, const std::string& text,
                          const std::string& finish_reason);

// The longest prefix of `text` that ends before any stop string; `hit` says whether one
// occurs. `keep` is how many trailing bytes may still grow into a stop string and must not be
// sent yet (a stream sends text[0, size - keep)).
struct StopScan {
  size_t end = 0, keep = 0;
  bool hit = false;
};
StopScan scan_stops(const std::string& text, const std::vector<std::string>& stops);

}  // namespace mf
