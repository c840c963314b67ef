#include "serve/generate_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/bandwidth.h"
#include "core/peer.h"
#include "core/q8.h"
#include "core/runtime.h"
#include "core/timing.h"
#include "io/model_io.h"
#include "model/moe_ffn.h"
#include "model/weight_dtype.h"
#include "moe/dispatch.h"
#include "serve/decode_engine.h"
#include "serve/generate.h"
#include "serve/llama_bench.h"

namespace mf {
namespace {

// prompt tokens per second at batch 1, the better of two timed runs after a warm-up (the prompt
// the llama.cpp peer times: token t = (7t + 1) mod V)
double prefill_speed(TransformerLM& model, int64_t length) {
  std::vector<int> prompt;
  for (int64_t t = 0; t < length; ++t) prompt.push_back(static_cast<int>((7 * t + 1) % model->config().vocab_size));
  SamplingOptions o;
  o.temperature = 0;
  o.max_tokens = 1;
  return static_cast<double>(length) / best_seconds(3, [&] { generate_batch(model, {prompt}, o); });
}

// bytes a weight is held in: int8 as q8 blocks of 32 numbers and a float32 scale (core/q8.h)
double weight_bytes(const std::string& held) {
  return held == "f32" ? 4.0 : held == "bf16" ? 2.0 : 1.0 + 4.0 / static_cast<double>(kQ8Block);
}

// One greedy decode of `prompts` timed whole (prompt processing included, as the peers time theirs)
// and from its first new token on: the decode steps alone, whose bytes the bandwidth bound counts.
struct DecodeTiming {
  double seconds = 0, step_seconds = 0;  // from the start; from the first new token to the last
  int64_t produced = 0, steps = 1;       // new tokens of all rows; of the longest row
  int64_t step_tokens = 0;               // new tokens after each row's first
  double step_tokens_per_s() const { return step_seconds > 0 ? static_cast<double>(step_tokens) / step_seconds : 0; }
};

DecodeTiming timed_decode(TransformerLM& model, const std::vector<std::vector<int>>& prompts, const SamplingOptions& o,
                          DecodePath path) {
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> counts(prompts.size(), 0);
  std::optional<Clock::time_point> first;
  Clock::time_point last;
  std::vector<DecodeRow> rows;
  for (size_t r = 0; r < prompts.size(); ++r)
    rows.push_back({prompts[r], o, [&, r](int) {
                      last = Clock::now();
                      if (!first) first = last;
                      ++counts[r];
                      return true;
                    }});
  const auto t0 = Clock::now();
  decode_rows(model, rows, path);
  DecodeTiming t;
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (first) t.step_seconds = std::chrono::duration<double>(last - *first).count();
  for (int64_t n : counts)
    t.produced += n, t.steps = std::max(t.steps, n), t.step_tokens += std::max<int64_t>(0, n - 1);
  return t;
}

GenerateBenchRow timed_row(TransformerLM& model, const std::vector<std::vector<int>>& prompts, const SamplingOptions& o,
                           DecodePath path) {
  OpCounter calls;
  const auto t = timed_decode(model, prompts, o, path);
  GenerateBenchRow row;
  row.tokens_per_s = static_cast<double>(t.produced) / t.seconds, row.step_tokens_per_s = t.step_tokens_per_s();
  row.calls_per_step = static_cast<double>(calls.calls()) / static_cast<double>(t.steps);
  return row;
}

// Batch 1 against the bandwidth bound measured beside it: kBoundRounds decodes, each between two
// streaming reads, a round's bound the faster of its two (this project's VMs drift by tens of
// percent within a minute: one read before and one after a whole benchmark read 0.48-0.73x for the
// same decoding); the row is the round of the median ratio. `bytes`: weight bytes per decode step.
GenerateBenchRow beside_bound(TransformerLM& model, const std::vector<std::vector<int>>& prompts,
                              const SamplingOptions& o, DecodePath path, double bytes) {
  std::vector<GenerateBenchRow> rounds;
  std::vector<double> reads = {read_bandwidth_gbs()};
  for (int i = 0; i < kBoundRounds; ++i) {
    rounds.push_back(timed_row(model, prompts, o, path));
    reads.push_back(read_bandwidth_gbs());
  }
  return median_beside_bound(rounds, reads, bytes);
}

}  // namespace

GenerateBenchRow median_beside_bound(std::vector<GenerateBenchRow> rounds, const std::vector<double>& reads,
                                     double bytes) {
  TORCH_CHECK(!rounds.empty() && reads.size() == rounds.size() + 1, "median_beside_bound: ", rounds.size(),
              " rounds need ", rounds.size() + 1, " reads, not ", reads.size());
  for (size_t i = 0; i < rounds.size(); ++i) {
    rounds[i].read_gbs = std::max(reads[i], reads[i + 1]);
    rounds[i].vs_bound = rounds[i].step_tokens_per_s * bytes / (rounds[i].read_gbs * 1e9);
  }
  std::sort(rounds.begin(), rounds.end(), [](const auto& a, const auto& b) { return a.vs_bound < b.vs_bound; });
  return rounds[rounds.size() / 2];
}

GenerateBenchResult bench_generate(const std::string& source, int64_t prompt_len, int64_t new_tokens,
                                   const std::vector<int64_t>& batches, const std::vector<std::string>& weights,
                                   const std::vector<int64_t>& prefill) {
  GenerateBenchResult r;
  std::vector<std::string> order;  // float32 first: holding in bf16 or int8 rounds the weights
  for (const auto* w : {"f32", "bf16", "int8"})
    if (std::find(weights.begin(), weights.end(), w) != weights.end()) order.push_back(w);
  if (order.empty()) throw ConfigError("bench generate --dtype: give some of f32, bf16 and int8");
  auto loaded = load_model_or_shape(source, parse_weight_dtype(order.front()));
  r.config = loaded.cfg;
  auto model = loaded.model;
  const auto counts = model->param_counts();
  r.weight_bytes_per_step = 4.0 * static_cast<double>(counts.active - counts.embedding);
  // measured before and after the decoding: a shared machine's bandwidth drifts, and the bound is the higher
  r.read_gbs = read_bandwidth_gbs();
  r.copy_gbs = copy_bandwidth_gbs();
  if (const auto moe = moe_layers(model->feed_forwards()); !moe.empty()) {
    torch::NoGradGuard g;
    const auto x = torch::empty({1, r.config.model.d_model}, torch::kFloat);  // activations stay float32
    r.units_path = to_string(units_path(x, *moe.front()->experts));
  }
  SamplingOptions o;
  o.temperature = 0;  // greedy: no sampling cost, every row runs to the end
  o.max_tokens = new_tokens;
  std::vector<DecodePath> paths = {DecodePath::Engine, DecodePath::Modules};
  r.engine_unsupported = DecodeEngine::unsupported(*model);
  if (!r.engine_unsupported.empty()) paths.erase(paths.begin());
  for (const auto& held : order) {
    hold_weights(*model, parse_weight_dtype(held));
    for (int64_t length : prefill) {
      if (length > r.config.model.max_seq_len)
        throw ConfigError(fmt::format("bench generate --prefill {}: longer than model.max_seq_len {}", length,
                                      r.config.model.max_seq_len));
      r.prefill.push_back({length, held, prefill_speed(model, length)});
    }
    for (int64_t batch : batches) {
      std::vector<std::vector<int>> prompts;
      for (int64_t b = 0; b < batch; ++b) {
        prompts.emplace_back();
        for (int64_t t = 0; t < prompt_len; ++t)
          prompts.back().push_back(static_cast<int>((7 * t + 13 * b + 1) % r.config.model.vocab_size));
      }
      for (auto path : paths) {
        generate_batch(model, prompts, o, path);  // warm-up
        auto row = batch == 1
                       ? beside_bound(model, prompts, o, path, r.weight_bytes_per_step / 4.0 * weight_bytes(held))
                       : timed_row(model, prompts, o, path);
        row.batch = batch, row.weights = held, row.decode = path == DecodePath::Engine ? "engine" : "modules";
        r.rows.push_back(row);
      }
    }
  }
  r.read_gbs = std::max(r.read_gbs, read_bandwidth_gbs());
  r.copy_gbs = std::max(r.copy_gbs, copy_bandwidth_gbs());
  r.bound_tokens_per_s = r.read_gbs * 1e9 / r.weight_bytes_per_step;
  return r;
}

GenerateBenchReport generate_bench_report(const GenerateBenchResult& r, const std::string& source,
                                          const std::string& peer, const std::string& llama, int64_t prompt_len,
                                          int64_t new_tokens, int threads, const std::vector<int64_t>& prefill) {
  const auto& m = r.config.model;
  nlohmann::json theirs = {{"skipped", "--peer ''"}};
  if (!peer.empty() && m.ffn == "moe")
    theirs = run_peer(peer,
                      fmt::format("--d {} --layers {} --heads {} --kv-heads {} --experts {} --top-k {} "
                                  "--expert-hidden {} --vocab {} --prompt {} --new-tokens {} --threads {}",
                                  m.d_model, m.n_layers, m.n_heads, m.n_kv_heads, m.moe.num_experts, m.moe.top_k,
                                  m.moe.expert_hidden, m.vocab_size, prompt_len, new_tokens, threads),
                      false);
  GenerateBenchReport out{ResultTable({{"batch", "batch", "", -6},
                                       {"weights", "weights", "", -8},
                                       {"decode", "decode", "", -8},
                                       {"tokens_per_s", "ours tokens/s", "{:.1f}", 14},
                                       {"step_tokens_per_s", "decode steps tokens/s", "{:.1f}", 22},
                                       {"vs_bound", "steps vs bound", "{:.2f}x", 15},
                                       {"calls_per_step", "LibTorch calls/step", "{:.0f}", 20},
                                       {"pytorch_tokens_per_s", "PyTorch tokens/s", "{:.1f}", 18},
                                       {"vs_pytorch", "ours vs PyTorch", "{:.2f}x", 16},
                                       {"llama_f32", "llama.cpp f32", "{:.1f}", 14},
                                       {"vs_llama_f32", "ours vs f32", "{:.2f}x", 12},
                                       {"llama_f16", "llama.cpp f16", "{:.1f}", 14},
                                       {"llama_q8_0", "llama.cpp q8_0", "{:.1f}", 15},
                                       {"vs_llama_q8_0", "ours vs q8_0", "{:.2f}x", 13}}),
                          ResultTable({{"prompt", "prefill prompt", "", -15},
                                       {"weights", "weights", "", -8},
                                       {"tokens_per_s", "ours tokens/s", "{:.0f}", 14},
                                       {"llama_f32", "llama.cpp f32", "{:.0f}", 14},
                                       {"llama_f16", "llama.cpp f16", "{:.0f}", 14},
                                       {"llama_q8_0", "llama.cpp q8_0", "{:.0f}", 15},
                                       {"vs_llama", "ours vs llama.cpp same width", "{:.2f}x", 29}}),
                          {{"source", source},
                           {"weight_bytes_per_step", r.weight_bytes_per_step},
                           {"read_gbs", r.read_gbs},
                           {"copy_gbs", r.copy_gbs},
                           {"bound_tokens_per_s", r.bound_tokens_per_s},
                           {"units_path", r.units_path},
                           {"pytorch", theirs},
                           {"llama_cpp", llama_cpp_decode(source, llama, prompt_len, new_tokens, threads, prefill)}},
                          ""};
  for (const auto& row : r.rows) {
    const auto key = fmt::format("batch{}{}{}_tokens_per_s", row.batch, row.weights == "f32" ? "" : "_" + row.weights,
                                 row.decode == "engine" ? "" : "_" + row.decode);
    nlohmann::json cells = {{"batch", row.batch},
                            {"weights", row.weights},
                            {"decode", row.decode},
                            {"tokens_per_s", row.tokens_per_s},
                            {"step_tokens_per_s", row.step_tokens_per_s},
                            {"calls_per_step", row.calls_per_step}};
    if (row.batch == 1) cells["vs_bound"] = row.vs_bound;
    const auto peer_key = fmt::format("batch{}_tokens_per_s", row.batch);  // PyTorch's float32
    if (theirs.contains(peer_key) && theirs[peer_key].get<double>() > 0)
      cells["pytorch_tokens_per_s"] = theirs[peer_key],
      cells["vs_pytorch"] = row.tokens_per_s / theirs[peer_key].get<double>();
    const auto& ll = out.json["llama_cpp"];
    if (row.batch == 1 && ll.contains("f32"))
      cells["llama_f32"] = ll["f32"], cells["vs_llama_f32"] = row.tokens_per_s / ll["f32"].get<double>(),
      cells["llama_f16"] = ll["f16"], cells["llama_q8_0"] = ll["q8_0"],
      cells["vs_llama_q8_0"] = row.tokens_per_s / ll["q8_0"].get<double>();
    out.table.add(cells);
    auto& ours = out.json["moeforge"];
    const auto stem = key.substr(0, key.size() - 12);  // "batch1_bf16_" of "batch1_bf16_tokens_per_s"
    ours[key] = row.tokens_per_s;
    ours[stem + "steps_tokens_per_s"] = row.step_tokens_per_s;
    ours[stem + "calls_per_step"] = row.calls_per_step;
    if (row.batch == 1) ours[stem + "vs_bound"] = row.vs_bound, ours[stem + "read_gbs"] = row.read_gbs;
  }
  for (const auto& row : r.prefill) {
    nlohmann::json cells = {{"prompt", row.prompt}, {"weights", row.weights}, {"tokens_per_s", row.tokens_per_s}};
    const auto& ll = out.json["llama_cpp"];
    const auto length = std::to_string(row.prompt);
    // beside its own width: f32 with f32, bf16 with f16, int8 with q8_0
    const std::string theirs_width = row.weights == "f32" ? "f32" : row.weights == "bf16" ? "f16" : "q8_0";
    for (const auto* dtype : {"f32", "f16", "q8_0"})
      if (ll.contains("prefill") && ll["prefill"].contains(dtype) && ll["prefill"][dtype].contains(length)) {
        const double theirs_rate = ll["prefill"][dtype][length];
        cells[std::string("llama_") + dtype] = theirs_rate;
        if (dtype == theirs_width) cells["vs_llama"] = row.tokens_per_s / theirs_rate;
      }
    out.prefill.add(cells);
    out.json["moeforge"][fmt::format("prefill{}{}_tokens_per_s", row.prompt,
                                     row.weights == "f32" ? "" : "_" + row.weights)] = row.tokens_per_s;
  }
  if (!r.units_path.empty()) out.note += "the modules ran the experts on the " + r.units_path + " units path\n";
  if (!r.engine_unsupported.empty()) out.note += "the decode engine does not run " + r.engine_unsupported + "\n";
  if (!theirs.contains("torch")) out.note += "PyTorch: " + theirs.value("skipped", "") + "\n";
  if (const auto& ll = out.json["llama_cpp"]; ll.contains("skipped"))
    out.note += "llama.cpp: " + ll["skipped"].get<std::string>() + "\n";
  else
    out.note += fmt::format(
        "llama.cpp (node-llama-cpp 3.21.1, its default f16 KV cache) at batch 1, the faster of {} and 1 threads: f32 "
        "{:.1f} ({} threads), f16 {:.1f} ({}), q8_0 {:.1f} ({}) tokens/s\n",
        threads, ll["f32"].get<double>(), ll["f32_threads"].get<int>(), ll["f16"].get<double>(),
        ll["f16_threads"].get<int>(), ll["q8_0"].get<double>(), ll["q8_0_threads"].get<int>());
  out.note += fmt::format(
      "bandwidth bound at batch 1: {:.1f} MB of active weights per step (float32; bf16 about half, int8 0.28x) read "
      "at the streaming-read bandwidth; \"steps vs bound\" is the decode steps' rate (the prompt's processing left "
      "out) over the bound of the same round, whose bandwidth is the faster of the reads just before and after it, the "
      "median of {} rounds; the reads at the benchmark's start and end ran up to {:.1f} GB/s ({:.0f} tokens/s), a "
      "copy at {:.1f} GB/s read + write; {} prompt + {} new tokens, greedy, {} threads\n",
      r.weight_bytes_per_step / 1e6, kBoundRounds, r.read_gbs, r.bound_tokens_per_s, r.copy_gbs, prompt_len, new_tokens,
      threads);
  return out;
}

}  // namespace mf
