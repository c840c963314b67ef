#include <fmt/format.h>

#include <spdlog/spdlog.h>
#include <chrono>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "analysis/confusion.h"
#include "analysis/svg_plot.h"
#include "cli/commands.h"
#include "core/runtime.h"
#include "core/util.h"
#include "data/idx.h"
#include "data/images.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "io/checkpoint.h"
#include "io/checkpoint_info.h"
#include "io/hf/hf_dir.h"
#include "io/upcycle.h"
#include "model/method_info.h"
#include "model/moe_ffn.h"
#include "serve/generate.h"
#include "train/evaluable.h"
#include "train/evaluate.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace mf::cli {
namespace {

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) ids.push_back(parse_int(item, "--tokens"));
  return ids;
}

// The logits and predicted classes of a classifier on the images of a gzip IDX file.
// "on" / "off" override the checkpoint config's eval.flip_average; "" keeps it
bool flip_average(const LoadedClassifier& l, const std::string& choice) {
  return choice.empty() ? l.cfg.eval.flip_average : choice == "on";
}

void dump_classifier_logits(const std::string& ckpt, const std::string& images_path, const std::string& out,
                            const std::string& flip) {
  auto l = load_classifier(ckpt);
  ImageDataset data(l.cfg.data.images_dir, l.cfg.data.val_images);  // normalisation statistics
  auto images = read_idx_gz(images_path, 3);
  if (images.size(1) != l.cfg.model.image_size || images.size(2) != l.cfg.model.image_size)
    throw std::runtime_error(fmt::format("{}: images are {}x{}, the model takes {}x{}", images_path, images.size(1),
                                         images.size(2), l.cfg.model.image_size, l.cfg.model.image_size));
  torch::NoGradGuard g;
  l.model->eval();
  auto logits = classify_logits(*l.model, data.normalize(images), flip_average(l, flip));
  auto predicted = logits.argmax(-1);
  save_safetensors(out, {{"logits", logits}, {"predicted", predicted}});
  const auto& names = ImageDataset::class_names();
  for (int64_t i = 0; i < std::min<int64_t>(predicted.size(0), 10); ++i) {
    const auto k = predicted[i].item<int64_t>();
    std::cout << fmt::format("image {}: {}\n", i,
                             k < static_cast<int64_t>(names.size()) ? names[k] : std::to_string(k));
  }
  std::cout << fmt::format("wrote logits [{}, {}] and predicted classes to {}\n", logits.size(0), logits.size(1), out);
}

// Loss, accuracy, per-class accuracy and a confusion-matrix SVG of an image classifier.
void evaluate_classifier_checkpoint(const std::string& ckpt, const std::string& split, const std::string& out,
                                    const std::string& flip) {
  auto l = load_classifier(ckpt);
  ImageDataset data(l.cfg.data.images_dir, l.cfg.data.val_images);
  const bool mirrored = flip_average(l, flip);
  auto r = evaluate_classifier(*l.model, data, split, 0, 256, mirrored);
  const int64_t K = l.cfg.model.num_classes;
  const auto confusion = confusion_matrix(r.labels, r.predictions, K);
  const auto& known = ImageDataset::class_names();
  std::vector<std::string> names;
  for (int64_t k = 0; k < K; ++k)
    names.push_back(k < static_cast<int64_t>(known.size()) ? known[k] : std::to_string(k));
  std::cout << fmt::format("{} split: {} images, loss {:.4f}, accuracy {:.2f} %{}\n\n{:<12} {:>8} {:>9}\n", split,
                           r.count, r.loss, 100 * r.accuracy,
                           mirrored ? " (logits averaged with each image's mirror image)" : "", "class", "images",
                           "accuracy");
  for (int64_t k = 0; k < K; ++k)
    std::cout << fmt::format("{:<12} {:>8.0f} {:>8.2f} %\n", names[k], confusion.images(k),
                             100 * confusion.accuracy(k));
  const std::string path =
      out.empty() ? (std::filesystem::path(read_checkpoint(ckpt).dir) / fmt::format("confusion_{}.svg", split)).string()
                  : out;
  write_file_atomic(path, confusion_svg(confusion, names,
                                        fmt::format("{} — confusion on {} ({:.2f} % accuracy)", l.cfg.run.name, split,
                                                    100 * r.accuracy)));
  std::cout << "\nwrote " << path << "\n";
}

// eval: LM per-domain loss, classifier accuracy and confusion, or logits dumps
struct EvalOptions {
  std::string ckpt, split = "test", data_dir, dump_path, dump_tokens, dump_text, confusion_out, images_path, flip;
  std::string dtype = "f32";
  int64_t windows = 64, seq_len = 0, threads = 0;
};

void run_eval(const EvalOptions& o) {
  if (o.threads > 0) set_compute_threads(static_cast<int>(o.threads));
  if (checkpoint_config(o.ckpt).model.task == "classify") {
    if (o.dump_path.empty()) return evaluate_classifier_checkpoint(o.ckpt, o.split, o.confusion_out, o.flip);
    if (o.images_path.empty()) throw CLI::ValidationError("--dump-logits on a classifier needs --images FILE.gz");
    return dump_classifier_logits(o.ckpt, o.images_path, o.dump_path, o.flip);
  }
  if (!o.dump_path.empty()) {
    auto l = load_model(o.ckpt, parse_weight_dtype(o.dtype));
    std::vector<int64_t> ids = parse_ids(o.dump_tokens);
    if (!o.dump_text.empty()) {
      for (int id : Tokenizer(l.tokenizer).encode(o.dump_text)) ids.push_back(id);
    }
    if (ids.empty()) throw CLI::ValidationError("--dump-logits needs --tokens or --text");
    for (auto id : ids)
      if (id < 0 || id >= l.cfg.model.vocab_size)
        throw CLI::ValidationError(fmt::format("token id {} out of range", id));
    torch::NoGradGuard g;
    l.model->eval();
    auto logits = l.model->forward(torch::tensor(ids, torch::kLong).unsqueeze(0)).squeeze(0);
    save_safetensors(o.dump_path, {{"logits", logits}, {"tokens", torch::tensor(ids, torch::kLong)}});
    std::cout << fmt::format("wrote logits [{}, {}] to {}\n", logits.size(0), logits.size(1), o.dump_path);
    return;
  }
  const auto losses =
      open_evaluable(o.ckpt, o.windows, o.data_dir, o.seq_len, parse_weight_dtype(o.dtype)).evaluate(o.split, {});
  std::cout << fmt::format("{:<12} {:>9} {:>11} {:>9}\n", "domain", "loss", "perplexity", "tokens");
  for (auto& d : losses)
    std::cout << fmt::format("{:<12} {:>9.4f} {:>11.2f} {:>9}\n", d.domain, d.loss, std::exp(d.loss), d.tokens);
  std::cout << fmt::format("{:<12} {:>9.4f} {:>11.2f}\n", "mean", mean_loss(losses), std::exp(mean_loss(losses)));
}

void add_eval(CLI::App& app) {
  auto* ev = app.add_subcommand("eval",
                                "per-domain loss and perplexity of a language model on the prepared corpus; "
                                "loss, accuracy, per-class accuracy and a confusion SVG of an image classifier");
  auto o = std::make_shared<EvalOptions>();
  ev->add_option("checkpoint", o->ckpt, "checkpoint directory, its model.safetensors, or a run directory")->required();
  ev->add_option("--split", o->split, "val or test")->check(CLI::IsMember({"val", "test"}));
  ev->add_option("--data", o->data_dir, "prepared corpus directory (default: the checkpoint config's data.dir)");
  ev->add_option("--windows", o->windows, "evaluation windows per domain")->check(CLI::Range(1, 100000));
  ev->add_option("--seq-len", o->seq_len, "window length (default: train.seq_len)");
  ev->add_option("--dump-logits", o->dump_path,
                 "write the logits of --tokens/--text (LM, tensor 'logits' [T, V]) or of --images (classifier: "
                 "'logits' [N, classes], 'predicted' [N]) as safetensors");
  ev->add_option("--images", o->images_path, "classifier: gzip IDX file of images for --dump-logits")
      ->check(CLI::ExistingFile);
  ev->add_option("--tokens", o->dump_tokens, "comma-separated token ids for --dump-logits");
  ev->add_option("--text", o->dump_text, "text to tokenize for --dump-logits");
  ev->add_option("--threads", o->threads, "intra-op threads (0 = default)");
  add_weight_dtype_option(ev, o->dtype, true);
  ev->add_option("--confusion", o->confusion_out,
                 "classifier: where the confusion SVG goes (default CKPT/confusion_SPLIT.svg)");
  ev->add_option("--flip-average", o->flip,
                 "classifier: on = predict from the mean logits of each image and its horizontal mirror image, "
                 "off = from the image alone (default: the checkpoint config's eval.flip_average)")
      ->check(CLI::IsMember({"on", "off"}));
  ev->callback([o] { run_eval(*o); });
}

struct GenerateOptions {
  std::string ckpt, prompt, dtype = "f32";
  SamplingOptions sampling;
  int64_t threads = 0;
};

void add_generate(CLI::App& app) {
  auto* gen = app.add_subcommand("generate", "sample text from a checkpoint (KV cache, temperature, top-p)");
  auto o = std::make_shared<GenerateOptions>();
  gen->add_option("checkpoint", o->ckpt,
                  "checkpoint directory, its model.safetensors, a run directory, or a Hugging Face model directory")
      ->required();
  gen->add_option("--prompt", o->prompt, "text to continue")->required();
  gen->add_option("--max-tokens", o->sampling.max_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  gen->add_option("--temperature", o->sampling.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-p", o->sampling.top_p, "nucleus mass")->check(CLI::Range(0.0, 1.0));
  gen->add_option("--seed", o->sampling.seed, "sampling seed");
  gen->add_option("--threads", o->threads, "intra-op threads (0 = default)");
  add_weight_dtype_option(gen, o->dtype, true);
  gen->callback([o] {
    if (o->threads > 0) set_compute_threads(static_cast<int>(o->threads));
    auto l = load_model(o->ckpt, parse_weight_dtype(o->dtype));
    Tokenizer tok(l.tokenizer);
    auto so = o->sampling;
    so.stop_token = tok.eos_id();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = generate(l.model, tok.encode(o->prompt), so);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << o->prompt << tok.decode(ids) << "\n";
    spdlog::info("generated {} tokens in {:.2f} s ({:.1f} tokens/s, prompt processing included)", ids.size(), seconds,
                 static_cast<double>(ids.size()) / std::max(seconds, 1e-9));
  });
}

void add_info(CLI::App& app) {
  auto* info = app.add_subcommand("info", "architecture, parameter counts and training state of a checkpoint");
  auto ckpt = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  info->add_option("checkpoint", *ckpt,
                   "checkpoint directory, its model.safetensors, a run directory, or a Hugging Face model directory")
      ->required();
  info->add_flag("--json", *as_json, "print JSON");
  info->callback([ckpt, as_json] {
    streaming_allocator();
    const auto r = checkpoint_info(*ckpt);
    if (*as_json) {
      std::cout << r.summary.dump(2) << "\n";
      return;
    }
    for (auto& [k, v] : r.summary.items())
      std::cout << fmt::format("{:<28} {}\n", k, v.is_string() ? v.get<std::string>() : v.dump());
    std::cout << "tensors:\n";
    for (auto& [name, e] : r.tensors)
      std::cout << fmt::format("  {:<52} {:>6} {}\n", name, c10::toString(e.dtype), c10::str(e.shape));
  });
}

struct UpcycleCommand {
  std::string in, out, layers;
  UpcycleOptions options;
};

void add_upcycle(CLI::App& app) {
  auto* up = app.add_subcommand("upcycle",
                                "turn dense FFN blocks of a trained checkpoint into MoE blocks whose experts are "
                                "copies of the dense FFN, tensor by tensor (peak memory ~ one upcycled block); "
                                "fine-tune the result with `train --init-from OUT`");
  auto o = std::make_shared<UpcycleCommand>();
  auto& uo = o->options;
  up->add_option("checkpoint", o->in, "dense checkpoint, a run directory (its latest) or a Hugging Face directory")
      ->required();
  up->add_option("-o,--out", o->out,
                 "output directory: a checkpoint, or for a Hugging Face input a Hugging Face directory of the MoE "
                 "architecture of its family (LLaMA -> Mixtral), in its dtype")
      ->required();
  up->add_option("--layers", o->layers, "blocks to convert, comma-separated (0-based), e.g. 1,3")->required();
  up->add_option("--method", uo.method,
                 "topk (softmax top-k), topp (cumulative mass) or a method's preset (unif: UniF-MoE)")
      ->capture_default_str()
      ->check(CLI::IsMember(upcycle_methods()));
  up->add_option("--experts", uo.experts, "routed experts K per block (unif: residual experts, plus the shared one)")
      ->capture_default_str();
  up->add_option("--top-k", uo.top_k, "topk: experts per token")->capture_default_str();
  up->add_option("--top-p", uo.top_p, "topp: cumulative router mass per token")->capture_default_str();
  up->add_option("--blocks", uo.blocks, "unif: blocks B per expert (must divide the FFN width)")->capture_default_str();
  up->add_option("--noise", uo.noise, "relative noise on the copies: W + noise * std(W) * N(0, 1)")
      ->capture_default_str();
  up->add_option("--seed", uo.seed, "router initialisation and noise")->capture_default_str();
  add_set_option(up, uo.sets);
  up->callback([o] {
    auto& uo = o->options;
    uo.layers = parse_block_list(o->layers, "upcycle --layers");
    auto r = upcycle(o->in, o->out, uo);
    std::cout << fmt::format("wrote {}{}: {} dense FFN tensors became experts, {} tensors copied as they are\n", o->out,
                             r.hf_arch.empty() ? "" : " (Hugging Face " + r.hf_arch + ")", r.converted, r.copied);
    std::cout << fmt::format("model.moe.layers = \"{}\", {} experts, method {}; run name \"{}\"\n",
                             r.config.model.moe.layers, uo.experts, uo.method, r.config.run.name);
    std::cout << fmt::format("fine-tune: moeforge train --init-from {} [--set train.steps=N]\n", o->out);
  });
}

}  // namespace

void register_model_commands(CLI::App& app) {
  add_eval(app);
  add_generate(app);
  add_info(app);
  add_upcycle(app);
}

}  // namespace mf::cli
