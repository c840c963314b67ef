// One arguments object for the whole system, filled from TOML and validated
// against a schema (config_schema.cpp) that also generates docs/config.md.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <typeindex>
#include <variant>
#include <vector>

namespace mf {

// Router policies and expert activations: parsed from their config strings once, during
// config loading, so the engine compares enums, never strings.
enum class RouterKind { SoftmaxTopK, SigmoidTopK, NormTopK, TopP, UniformRandom, Balanced };
enum class Activation { SwiGLU, GELU };
const std::vector<std::string>& router_kind_names();  // in enum order
const std::vector<std::string>& activation_names();
std::string to_string(RouterKind k);
RouterKind parse_router_kind(const std::string& name);  // throws ConfigError
Activation parse_activation(const std::string& name);
std::string to_string(Activation a);

// A method's config sub-table (e.g. [model.moe.unipool]) is a struct in the method's folder;
// the config holds one copy per method that was touched, default-constructed on first use.
struct MethodSection {
  virtual ~MethodSection() = default;
  virtual std::unique_ptr<MethodSection> clone() const = 0;
};
template <class T>
struct MethodSectionOf : MethodSection {
  std::unique_ptr<MethodSection> clone() const override { return std::make_unique<T>(static_cast<const T&>(*this)); }
};

class MethodSections {
 public:
  MethodSections() = default;
  MethodSections(const MethodSections& o) { *this = o; }
  MethodSections& operator=(const MethodSections& o) {
    if (this == &o) return *this;
    map_.clear();
    for (auto& [k, v] : o.map_) map_[k] = v->clone();
    return *this;
  }
  template <class T>
  T& get() {
    auto& p = map_[std::type_index(typeid(T))];
    if (!p) p = std::make_unique<T>();
    return static_cast<T&>(*p);
  }
  template <class T>
  const T& get() const {
    static const T defaults{};
    auto it = map_.find(std::type_index(typeid(T)));
    return it == map_.end() ? defaults : static_cast<const T&>(*it->second);
  }

 private:
  std::map<std::type_index, std::unique_ptr<MethodSection>> map_;
};

// Mixture-of-Experts FFN slots (model.ffn = "moe"); see ../shared/specs/baselines.md.
// The engine's keys live here; each method's keys live in its sub-table (`section<T>()`).
struct MoeConfig {
  std::string layers = "all";  // all | every_other | first_dense:N | explicit list "1,3,5"
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t expert_hidden = 352;  // F: the hidden width of one routed expert
  Activation activation = Activation::SwiGLU;
  bool expert_bias = false;
  RouterKind router = RouterKind::SoftmaxTopK;
  bool renormalize = true;
  bool norm_renormalize = false;  // norm_topk: UniPool uses the selected scores as they are
  double norm_eps = 1e-8;
  double top_p = 0.5;
  double aux_loss_coef = 1e-2;
  double z_loss_coef = 1e-3;
  double seq_aux_loss_coef = 0.0;
  double bias_update = 0.0;          // DeepSeek-V3 aux-loss-free balancing step (0 = off)
  double gate_scale = 0.0;           // > 0: combine weights times a learnable scalar starting here (0 = off)
  int64_t n_shared = 0;              // always-on shared experts (one SwiGLU of width n_shared * expert_hidden)
  std::string dense_ffn = "swiglu";  // the FFN of the blocks model.moe.layers leaves dense: swiglu | gelu
  double capacity_factor = 0.0;      // 0 = dropless
  int64_t shared_hidden = 0;         // the shared expert's width (0: n_shared * expert_hidden)
  bool shared_gate = false;          // Qwen2-MoE: the shared expert's output times sigmoid(x w), w [1, D]
  MethodSections sections;           // [model.moe.<method>] sub-tables
  template <class T>
  T& section() {
    return sections.get<T>();
  }
  template <class T>
  const T& section() const {
    return sections.get<T>();
  }
};

struct ModelConfig {
  int64_t vocab_size = 0;  // not a config key: taken from the tokenizer
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 4;
  int64_t ffn_hidden = 704;
  int64_t max_seq_len = 512;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  bool scale_out_init = true;  // output projections get std / sqrt(2 * n_layers)
  std::string ffn = "swiglu";  // swiglu | gelu | moe (or a kind a method registers)
  // Attention variants of the Hugging Face architectures (src/io/hf/README.md)
  int64_t head_dim = 0;          // 0: d_model / n_heads
  bool qkv_bias = false;         // biases on q, k and v (Qwen2)
  bool o_bias = false;           // a bias on the output projection
  std::string qk_norm = "none";  // none | head (RMSNorm over each head of q and k: Qwen3) | full (over the whole q and
                                 // k projections: OLMoE)
  bool tie_embeddings = false;   // the LM head is the token embedding
  int64_t head_width() const { return head_dim > 0 ? head_dim : d_model / n_heads; }
  MoeConfig moe;
  // The task the model serves: "lm" (the LLaMA-style decoder) or "classify" (a ViT over images).
  std::string task = "lm";
  int64_t image_size = 28;  // classify: square images of this side
  int64_t patch_size = 4;   // classify: square patches (image_size must be a multiple)
  int64_t channels = 1;
  int64_t stem_channels = 0;  // classify: > 0 puts a 3x3 convolution + GELU with this many channels before patchify
  int64_t num_classes = 10;
  std::string pool = "cls";  // classify: the head reads the class token (cls) or the patch tokens' mean
};

// Whether block `layer` gets an MoE FFN under model.moe.layers (throws ConfigError on a bad pattern).
bool is_moe_layer(const ModelConfig& m, int64_t layer);
// Whether model.moe.layers picks block `layer`, whatever model.ffn is (the routed slot kinds a
// method registers, e.g. "intb", use the same pattern).
bool in_moe_layers(const ModelConfig& m, int64_t layer);
int64_t num_moe_layers(const ModelConfig& m);

struct DataConfig {
  std::string dir = "data";
  std::string source_root = "/";  // where the Debian packages' files are found
  int64_t vocab_size = 8192;
  int64_t tokenizer_sample_bytes = 1500000;  // per domain
  int64_t max_source_bytes = 0;              // per domain, 0 = all (small values for quick tests)
  double weight_dictionary = 1.0;
  double weight_scripture = 1.0;
  double weight_technical = 1.0;
  double weight_quotations = 1.0;
  // classify: IDX files (gzip) as Debian's dataset-fashion-mnist installs them
  std::string images_dir = "/usr/share/datasets/fashion-mnist";
  int64_t val_images = 5000;  // the last training images form the validation split
  bool augment = true;        // random crop (crop_padding-pixel padding) and horizontal flip
  int64_t crop_padding = 2;
  double erase_prob = 0.0;      // random erasing (Zhong et al. 2017): probability per image
  std::string classes = "all";  // the classes every split keeps: all | a list "0,2,4,6"
};

struct TrainConfig {
  int64_t seed = 1234;
  int64_t steps = 1000;
  int64_t batch_size = 16;
  int64_t seq_len = 128;
  int64_t grad_accum = 1;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 50;
  double weight_decay = 0.1;
  double label_smoothing = 0.0;  // classify: training targets (1 - eps) one-hot + eps / C
  bool decay_embeddings = false;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  int64_t threads = 2;
  int64_t log_every = 10;
  int64_t ckpt_every = 250;
  int64_t keep_checkpoints = 2;
  bool shard_checkpoints = true;  // with W > 1 ranks, each rank writes 1/W of every checkpoint
  bool overlap_grad_sum = false;  // with W > 1 ranks, gradient sums start during the backward
                                  // (on a Gloo channel of its own, train/grad_overlap.h)
  int64_t skip_nonfinite = 0;     // steps with a non-finite loss or gradient skipped before the run stops
};

struct EvalConfig {
  int64_t every = 250;
  int64_t windows = 32;  // per domain
  int64_t batch_size = 16;
  bool flip_average = false;  // classifier: mean logits of each image and its mirror image
};

struct SampleConfig {
  std::string prompt = "The meaning of";
  int64_t max_tokens = 48;
  double temperature = 0.8;
  double top_p = 0.9;
  int64_t seed = 7;
};

struct RunConfig {
  std::string name = "quickstart";
  std::string out_dir = "runs";
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  SampleConfig sample;
  RunConfig run;
};

enum class ValueType { Int, Float, Bool, String };
using Value = std::variant<int64_t, double, bool, std::string>;

struct KeySpec {
  std::string path;
  ValueType type;
  std::string help;
  double min = 0, max = 0;           // inclusive range for numbers (min<=max to enable)
  std::vector<std::string> choices;  // allowed strings (empty = any)
  std::function<Value(const Config&)> get;
  std::function<void(Config&, const Value&)> set;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every key: the core keys (config_schema.cpp), then those the methods registered.
const std::vector<KeySpec>& config_schema();
// Methods add the keys of their sub-table, the old flat paths they replaced (still accepted
// when loading, e.g. from older checkpoints) and their cross-field checks.
void register_config_keys(std::vector<KeySpec> keys);
void register_config_alias(const std::string& old_path, const std::string& new_path);
void register_config_validator(std::function<void(const Config&)> check);
const KeySpec* find_key(const std::string& path);
std::string closest_key(const std::string& path);

Config load_config(const std::string& path);
// A TOML file ("": the defaults) with `sets` ("key=value") applied and the result validated.
Config resolve_config(const std::string& path, const std::vector<std::string>& sets);
void apply_toml_text(Config& cfg, const std::string& text, const std::string& source);
void apply_override(Config& cfg, const std::string& assignment);  // "train.lr=3e-4"
// data.classes as class indices ({} = all); ConfigError when it is neither all nor a list.
std::vector<int64_t> image_classes(const DataConfig& d);
void validate(const Config& cfg);  // cross-field checks
std::string to_toml(const Config& cfg);
std::string value_to_string(const Value& v);
std::string schema_markdown();

}  // namespace mf
