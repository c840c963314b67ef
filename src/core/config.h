// One arguments object for the whole system, filled from TOML and validated
// against a schema (config_schema.cpp) that also generates docs/config.md.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace mf {

// Mixture-of-Experts FFN slots (model.ffn = "moe"); see ../shared/specs/baselines.md.
struct MoeConfig {
  std::string layers = "all";  // all | every_other | first_dense:N | explicit list "1,3,5"
  int64_t num_experts = 8;
  int64_t top_k = 2;
  int64_t expert_hidden = 352;
  std::string activation = "swiglu";
  bool expert_bias = false;
  std::string router = "softmax_topk";  // softmax_topk | sigmoid_topk | norm_topk | top_p | uniform_random | balanced
  bool renormalize = true;
  bool norm_renormalize = false;  // norm_topk: UniPool uses the selected scores as they are
  double norm_eps = 1e-8;
  double top_p = 0.5;
  double aux_loss_coef = 1e-2;
  double z_loss_coef = 1e-3;
  double seq_aux_loss_coef = 0.0;
  double bias_update = 0.0;  // DeepSeek-V3 aux-loss-free balancing step (0 = off)
  int64_t n_shared = 0;      // always-on shared experts (one SwiGLU of width n_shared * expert_hidden)
  double capacity_factor = 0.0;  // 0 = dropless
  // UniPool (../shared/specs/unipool.md): MoE layers split into pool_groups contiguous groups,
  // each sharing one pool of pool_size / pool_groups experts. 0 = every layer owns its experts.
  int64_t pool_groups = 0;
  int64_t pool_size = 0;            // total pool experts M (0 = num_experts x MoE layers, the vanilla budget)
  double pool_aux_loss_coef = 0.0;  // pool-level balance loss alpha_pool (one step behind)
  // LatentMoE (../shared/specs/latentmoe.md): per MoE layer "l,m,N,K,ms" separated by ';'
  // (one entry = every MoE layer). Routed experts work in an l-wide latent space.
  std::string latent;
};

// The resolved shape of one MoE layer.
struct MoELayerShape {
  int64_t latent = 0;  // l; 0 = experts work on the full width d
  int64_t expert_hidden = 0, num_experts = 0, top_k = 0;
  int64_t shared_hidden = 0;  // width of the full-width shared SwiGLU expert (0 = none)
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
  std::string ffn = "swiglu";  // swiglu | moe
  MoeConfig moe;
};

// Whether block `layer` gets an MoE FFN under model.moe.layers (throws ConfigError on a bad pattern).
bool is_moe_layer(const ModelConfig& m, int64_t layer);
int64_t num_moe_layers(const ModelConfig& m);
// Experts a router of this model chooses among: num_experts, or the group's pool size.
int64_t routed_experts(const ModelConfig& m);
// Shape of MoE block `layer` (model.moe.* or its model.moe.latent entry); throws ConfigError.
MoELayerShape moe_layer_shape(const ModelConfig& m, int64_t layer);
std::vector<MoELayerShape> parse_latent_shapes(const std::string& spec);  // "l,m,N,K,ms;..."
std::string format_latent_shapes(const std::vector<MoELayerShape>& shapes);

struct DataConfig {
  std::string dir = "data";
  std::string source_root = "/";  // where the Debian packages' files are found
  int64_t vocab_size = 8192;
  int64_t tokenizer_sample_bytes = 1500000;  // per domain
  int64_t max_source_bytes = 0;  // per domain, 0 = all (small values for quick tests)
  double weight_dictionary = 1.0;
  double weight_scripture = 1.0;
  double weight_technical = 1.0;
  double weight_quotations = 1.0;
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
  bool decay_embeddings = false;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  int64_t threads = 2;
  int64_t log_every = 10;
  int64_t ckpt_every = 250;
  int64_t keep_checkpoints = 2;
};

struct EvalConfig {
  int64_t every = 250;
  int64_t windows = 32;  // per domain
  int64_t batch_size = 16;
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
  double min = 0, max = 0;            // inclusive range for numbers (min<=max to enable)
  std::vector<std::string> choices;   // allowed strings (empty = any)
  std::function<Value(const Config&)> get;
  std::function<void(Config&, const Value&)> set;
};

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const std::vector<KeySpec>& config_schema();
const KeySpec* find_key(const std::string& path);
std::string closest_key(const std::string& path);

Config load_config(const std::string& path);
void apply_toml_text(Config& cfg, const std::string& text, const std::string& source);
void apply_override(Config& cfg, const std::string& assignment);  // "train.lr=3e-4"
void validate(const Config& cfg);  // cross-field checks
std::string to_toml(const Config& cfg);
std::string value_to_string(const Value& v);
std::string schema_markdown();

}  // namespace mf
