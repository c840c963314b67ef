// The config schema: every valid key, its type, range, default and help.
#include "core/config_keys.h"

namespace mf {
namespace {

// a key of a top-level section: key("train.lr", &Config::train, &TrainConfig::lr, ...)
template <class S, class T>
KeySpec key(const char* path, S Config::*sec, T S::*field, const char* help, double lo = 1, double hi = 0,
            std::vector<std::string> choices = {}) {
  return key_at<T>(
      path, [sec, field](Config& c) -> T& { return (c.*sec).*field; }, help, lo, hi, std::move(choices));
}

#define MOE_REF(field) \
  [](Config & c) -> auto& { return c.model.moe.field; }

std::vector<KeySpec> build_schema() {
  using C = Config;
  return {
      key("model.d_model", &C::model, &ModelConfig::d_model, "hidden size", 8, 65536),
      key("model.n_layers", &C::model, &ModelConfig::n_layers, "number of decoder blocks", 1, 512),
      key("model.n_heads", &C::model, &ModelConfig::n_heads, "attention (query) heads", 1, 1024),
      key("model.n_kv_heads", &C::model, &ModelConfig::n_kv_heads, "key/value heads (GQA); must divide n_heads", 1,
          1024),
      key("model.ffn_hidden", &C::model, &ModelConfig::ffn_hidden, "SwiGLU hidden width", 1, 1 << 20),
      key("model.max_seq_len", &C::model, &ModelConfig::max_seq_len, "longest sequence (RoPE table, KV cache)", 2,
          1 << 20),
      key("model.rope_theta", &C::model, &ModelConfig::rope_theta, "RoPE base", 1, kInf),
      key("model.norm_eps", &C::model, &ModelConfig::norm_eps, "RMSNorm epsilon", 0, 1),
      key("model.head_dim", &C::model, &ModelConfig::head_dim, "attention head width (0: d_model / n_heads)", 0, 4096),
      key("model.qkv_bias", &C::model, &ModelConfig::qkv_bias, "biases on the q, k and v projections (Qwen2)"),
      key("model.o_bias", &C::model, &ModelConfig::o_bias, "a bias on the attention output projection"),
      key("model.qk_norm", &C::model, &ModelConfig::qk_norm,
          "RMSNorm on queries and keys: none, head (each head, Qwen3) or full (the whole projection, OLMoE)", 1, 0,
          {"none", "head", "full"}),
      key("model.tie_embeddings", &C::model, &ModelConfig::tie_embeddings, "the LM head reuses the token embedding"),
      key("model.init_std", &C::model, &ModelConfig::init_std, "std of normal init for all weights (UniPool used 0.01)",
          0, 10),
      key("model.scale_out_init", &C::model, &ModelConfig::scale_out_init,
          "scale output projections' init std by 1/sqrt(2*n_layers)"),
      key("model.ffn", &C::model, &ModelConfig::ffn,
          "feed-forward slot kind: swiglu (dense LLaMA FFN), gelu (dense ViT FFN with biases), moe, or one a method "
          "registers"),
      key("model.task", &C::model, &ModelConfig::task,
          "lm: decoder language model on the text corpus; classify: ViT image classifier (Fashion-MNIST)", 1, 0,
          {"lm", "classify"}),
      key("model.image_size", &C::model, &ModelConfig::image_size, "classify: image side in pixels", 1, 4096),
      key("model.patch_size", &C::model, &ModelConfig::patch_size,
          "classify: patch side in pixels (divides image_size)", 1, 4096),
      key("model.channels", &C::model, &ModelConfig::channels, "classify: image channels", 1, 64),
      key("model.stem_channels", &C::model, &ModelConfig::stem_channels,
          "classify: 0 embeds raw patches; N > 0 first maps each pixel's 3x3 neighbourhood to N channels with a "
          "convolution + GELU (an early-convolution stem), then embeds patches of those channels",
          0, 1024),
      key("model.pool", &C::model, &ModelConfig::pool,
          "classify: what the head reads: cls (the class token) or mean (the mean of the patch tokens)", 1, 0,
          {"cls", "mean"}),
      key("model.num_classes", &C::model, &ModelConfig::num_classes, "classify: classes", 2, 100000),
      key_at<std::string>("model.moe.layers", MOE_REF(layers),
                          "which blocks are MoE: all, every_other, first_dense:N or a list like \"1,3\""),
      key_at<int64_t>("model.moe.num_experts", MOE_REF(num_experts), "routed experts E", 1, 4096),
      key_at<int64_t>("model.moe.top_k", MOE_REF(top_k), "experts per token k (<= num_experts)", 1, 4096),
      key_at<int64_t>("model.moe.expert_hidden", MOE_REF(expert_hidden), "hidden width of each expert", 1, 1 << 20),
      enum_key_at<Activation>("model.moe.activation", MOE_REF(activation), "expert activation", activation_names()),
      key_at<bool>("model.moe.expert_bias", MOE_REF(expert_bias), "give experts biases (GELU ViT experts use them)"),
      enum_key_at<RouterKind>("model.moe.router", MOE_REF(router), "routing policy (norm_topk is UniPool's NormRouter)",
                              router_kind_names()),
      key_at<bool>("model.moe.renormalize", MOE_REF(renormalize),
                   "divide the selected weights by their sum (softmax_topk, sigmoid_topk, top_p)"),
      key_at<bool>("model.moe.norm_renormalize", MOE_REF(norm_renormalize),
                   "norm_topk (UniPool NormRouter): divide the selected scores by their sum"),
      key_at<double>("model.moe.norm_eps", MOE_REF(norm_eps), "norm_topk: epsilon added to the logits' L2 norm", 0, 1),
      key_at<double>("model.moe.top_p", MOE_REF(top_p), "cumulative mass for router = top_p", 0, 1),
      key_at<double>(
          "model.moe.gate_scale", MOE_REF(gate_scale),
          "> 0: multiply the combine weights by a learnable scalar initialised to this (mlp.gate.gate_scale, "
          "no weight decay), e.g. E for softmax top-1, whose weights start near 1/E, as a gate-scale control "
          "to NormRouter (0 = off)",
          0, 1e6),
      key_at<double>("model.moe.aux_loss_coef", MOE_REF(aux_loss_coef), "Switch load-balancing loss alpha (0 = off)", 0,
                     100),
      key_at<double>("model.moe.z_loss_coef", MOE_REF(z_loss_coef), "router z-loss beta (0 = off)", 0, 100),
      key_at<double>("model.moe.seq_aux_loss_coef", MOE_REF(seq_aux_loss_coef),
                     "sequence-wise balance loss alpha (DeepSeek-V3 uses 1e-4 with bias_update; 0 = off)", 0, 100),
      key_at<double>("model.moe.bias_update", MOE_REF(bias_update),
                     "aux-loss-free balancing: selection-bias step gamma after each optimizer step (0 = off)", 0, 1),
      key_at<int64_t>("model.moe.n_shared", MOE_REF(n_shared), "always-on shared experts", 0, 64),
      key_at<std::string>("model.moe.dense_ffn", MOE_REF(dense_ffn),
                          "FFN of the blocks model.moe.layers leaves dense (gelu for ViTs)", 1, 0, {"swiglu", "gelu"}),
      key_at<int64_t>("model.moe.shared_hidden", MOE_REF(shared_hidden),
                      "width of the shared expert (0: n_shared * expert_hidden)", 0, 1 << 20),
      key_at<bool>("model.moe.shared_gate", MOE_REF(shared_gate),
                   "scale the shared expert's output by sigmoid(x w) (Qwen2-MoE's shared_expert_gate)"),
      key_at<double>("model.moe.capacity_factor", MOE_REF(capacity_factor), "per-expert capacity factor (0 = dropless)",
                     0, 1000),

      key("data.dir", &C::data, &DataConfig::dir, "prepared corpus directory (tokenizer, shards, manifest)"),
      key("data.source_root", &C::data, &DataConfig::source_root,
          "filesystem root where the Debian corpus packages are found"),
      key("data.vocab_size", &C::data, &DataConfig::vocab_size, "SentencePiece BPE vocabulary size", 300, 65535),
      key("data.tokenizer_sample_bytes", &C::data, &DataConfig::tokenizer_sample_bytes,
          "bytes per domain used to train the tokenizer", 1000, 1e10),
      key("data.max_source_bytes", &C::data, &DataConfig::max_source_bytes,
          "use only this many bytes of text per domain (0 = all; for quick tests)", 0, 1e12),
      key("data.weight_dictionary", &C::data, &DataConfig::weight_dictionary,
          "training mixture weight of the dictionary domain (gcide)", 0, 1e6),
      key("data.weight_scripture", &C::data, &DataConfig::weight_scripture,
          "training mixture weight of the scripture domain (KJV)", 0, 1e6),
      key("data.weight_technical", &C::data, &DataConfig::weight_technical,
          "training mixture weight of the technical domain (C++ Annotations)", 0, 1e6),
      key("data.weight_quotations", &C::data, &DataConfig::weight_quotations,
          "training mixture weight of the quotations domain (fortunes)", 0, 1e6),

      key("data.images_dir", &C::data, &DataConfig::images_dir,
          "classify: directory of the gzip IDX files (train-*, t10k-*; Debian's dataset-fashion-mnist)"),
      key("data.val_images", &C::data, &DataConfig::val_images,
          "classify: the last N training images form the validation split", 0, 1e7),
      key("data.classes", &C::data, &DataConfig::classes,
          "classify: the classes the train, val and test splits keep: all, or a list of class indices like "
          "\"0,2,4,6\" (a shift: pretrain on some classes, fine-tune on the others)"),
      key("data.augment", &C::data, &DataConfig::augment,
          "classify: random crop after zero padding (data.crop_padding pixels), and horizontal flip"),
      key("data.crop_padding", &C::data, &DataConfig::crop_padding,
          "classify, with data.augment: the largest shift in pixels (0 = flips only)", 0, 16),
      key("data.erase_prob", &C::data, &DataConfig::erase_prob,
          "classify, with data.augment: probability that an image has a random rectangle (2-40 % of its "
          "area, aspect 0.3-3.3) set to the mean pixel (random erasing)",
          0, 1),

      key("train.seed", &C::train, &TrainConfig::seed, "seed for init and data order", 0, 9e15),
      key("train.steps", &C::train, &TrainConfig::steps, "optimizer steps", 1, 1e12),
      key("train.batch_size", &C::train, &TrainConfig::batch_size, "sequences per micro-batch", 1, 1e6),
      key("train.seq_len", &C::train, &TrainConfig::seq_len, "tokens per training sequence", 2, 1 << 20),
      key("train.grad_accum", &C::train, &TrainConfig::grad_accum, "micro-batches per optimizer step", 1, 1e6),
      key("train.lr", &C::train, &TrainConfig::lr, "peak learning rate", 0, 10),
      key("train.min_lr_ratio", &C::train, &TrainConfig::min_lr_ratio,
          "final LR of the cosine schedule as a fraction of the peak", 0, 1),
      key("train.warmup_steps", &C::train, &TrainConfig::warmup_steps, "linear warmup steps", 0, 1e12),
      key("train.weight_decay", &C::train, &TrainConfig::weight_decay, "AdamW decoupled weight decay", 0, 10),
      key("train.label_smoothing", &C::train, &TrainConfig::label_smoothing,
          "classify: training targets are (1 - eps) one-hot + eps / classes (evaluation loss is unsmoothed)", 0, 0.99),
      key("train.decay_embeddings", &C::train, &TrainConfig::decay_embeddings,
          "apply weight decay to the token embedding too"),
      key("train.beta1", &C::train, &TrainConfig::beta1, "AdamW beta1", 0, 1),
      key("train.beta2", &C::train, &TrainConfig::beta2, "AdamW beta2", 0, 1),
      key("train.adam_eps", &C::train, &TrainConfig::adam_eps, "AdamW epsilon", 0, 1),
      key("train.grad_clip", &C::train, &TrainConfig::grad_clip, "max global grad norm (0 = off)", 0, 1e9),
      key("train.threads", &C::train, &TrainConfig::threads,
          "intra-op threads per process (0 = the cores shared among this machine's workers: all of them in one "
          "process, one each for `launch --nproc 2` on 2 cores)",
          0, 1024),
      key("train.log_every", &C::train, &TrainConfig::log_every, "steps between metric lines", 1, 1e12),
      key("train.ckpt_every", &C::train, &TrainConfig::ckpt_every, "steps between checkpoints (0 = only at the end)", 0,
          1e12),
      key("train.keep_checkpoints", &C::train, &TrainConfig::keep_checkpoints,
          "how many recent checkpoints to keep (0 = all)", 0, 1e6),
      key("train.overlap_grad_sum", &C::train, &TrainConfig::overlap_grad_sum,
          "with W > 1 ranks, each bucket of ~4 MB of gradients starts its sum over ranks as soon as the last "
          "backward of the step has produced it (c10d's Reducer scheme); off by default: on 2 CPU cores it hides "
          "the communication but Gloo's reduction then competes with the backward for the cores (7 % fewer "
          "tokens/s measured, docs/benchmarks.md); false: one sum after the backward"),
      key("train.shard_checkpoints", &C::train, &TrainConfig::shard_checkpoints,
          "with W > 1 ranks, each rank writes a shard of every checkpoint (model-0000r-of-0000W.safetensors, the "
          "same for the optimizer, plus index files); false: rank 0 writes single files. Either resumes at any "
          "world size; `moeforge export --format checkpoint` gathers a sharded one into single files"),
      key("train.skip_nonfinite", &C::train, &TrainConfig::skip_nonfinite,
          "steps with a non-finite loss or gradient norm to skip (no update) before the run stops; 0 = stop at the "
          "first",
          0, 1e6),

      key("eval.every", &C::eval, &EvalConfig::every, "steps between validation passes (0 = only at the end)", 0, 1e12),
      key("eval.windows", &C::eval, &EvalConfig::windows, "fixed validation windows per domain", 1, 1e5),
      key("eval.batch_size", &C::eval, &EvalConfig::batch_size, "windows per evaluation batch", 1, 1e6),
      key("eval.flip_average", &C::eval, &EvalConfig::flip_average,
          "classifier: predict from the mean of the logits of each image and of its horizontal mirror image "
          "(test-time augmentation for a model trained with flips; two forward passes); applies to the "
          "validation passes, `eval` and `eval --dump-logits`"),

      key("sample.prompt", &C::sample, &SampleConfig::prompt, "prompt of the text sample printed after training"),
      key("sample.max_tokens", &C::sample, &SampleConfig::max_tokens, "tokens to generate", 0, 1e6),
      key("sample.temperature", &C::sample, &SampleConfig::temperature, "sampling temperature (0 = greedy)", 0, 100),
      key("sample.top_p", &C::sample, &SampleConfig::top_p, "nucleus sampling mass", 0, 1),
      key("sample.seed", &C::sample, &SampleConfig::seed, "sampling seed", 0, 9e15),

      key("run.name", &C::run, &RunConfig::name, "run name: output goes to OUT_DIR/NAME"),
      key("run.out_dir", &C::run, &RunConfig::out_dir, "directory holding runs"),
  };
}

}  // namespace

std::vector<KeySpec>& schema_storage() {
  static std::vector<KeySpec> schema = build_schema();
  return schema;
}

const std::vector<KeySpec>& config_schema() { return schema_storage(); }

void register_config_keys(std::vector<KeySpec> keys) {
  auto& s = schema_storage();
  for (auto& k : keys) {
    if (find_key(k.path)) continue;  // registering twice is harmless
    s.push_back(std::move(k));
  }
}

}  // namespace mf
