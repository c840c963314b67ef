#include "core/config.h"

#include "core/util.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace mf {

namespace {
std::map<std::string, std::string>& aliases() {
  static std::map<std::string, std::string> a;
  return a;
}
std::vector<std::function<void(const Config&)>>& validators() {
  static std::vector<std::function<void(const Config&)>> v;
  return v;
}
}  // namespace

void register_config_alias(const std::string& old_path, const std::string& new_path) { aliases()[old_path] = new_path; }
void register_config_validator(std::function<void(const Config&)> check) { validators().push_back(std::move(check)); }

const KeySpec* find_key(const std::string& path) {
  for (const auto& k : config_schema())
    if (k.path == path) return &k;
  if (auto it = aliases().find(path); it != aliases().end()) return find_key(it->second);
  return nullptr;
}

const std::vector<std::string>& router_kind_names() {
  static const std::vector<std::string> n = {"softmax_topk", "sigmoid_topk",   "norm_topk",
                                             "top_p",        "uniform_random", "balanced"};
  return n;
}
const std::vector<std::string>& activation_names() {
  static const std::vector<std::string> n = {"swiglu", "gelu"};
  return n;
}
std::string to_string(RouterKind k) { return router_kind_names().at(static_cast<size_t>(k)); }
std::string to_string(Activation a) { return activation_names().at(static_cast<size_t>(a)); }

template <class E>
static E parse_name(const std::vector<std::string>& names, const std::string& name, const char* what) {
  auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) throw ConfigError(fmt::format("unknown {} '{}'", what, name));
  return static_cast<E>(it - names.begin());
}
RouterKind parse_router_kind(const std::string& name) {
  return parse_name<RouterKind>(router_kind_names(), name, "router kind");
}
Activation parse_activation(const std::string& name) {
  return parse_name<Activation>(activation_names(), name, "activation");
}

// Edit distance for "did you mean" hints; small enough to not need a library.
static size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& path) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : config_schema()) {
    size_t d = edit_distance(path, k.path);
    if (d < best_d) {
      best_d = d;
      best = k.path;
    }
  }
  return best;
}

static const char* type_name(ValueType t) {
  switch (t) {
    case ValueType::Int: return "integer";
    case ValueType::Float: return "float";
    case ValueType::Bool: return "boolean";
    default: return "string";
  }
}

std::string value_to_string(const Value& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) {
    std::string s = fmt::format("{}", *d);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep TOML float type
    return s;
  }
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  std::string out = "\"";
  for (char c : std::get<std::string>(v)) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

static std::string range_text(const KeySpec& k) {
  if (!k.choices.empty()) {
    std::string s;
    for (auto& c : k.choices) s += (s.empty() ? "" : ", ") + c;
    return "one of {" + s + "}";
  }
  if (k.min <= k.max) return fmt::format("[{}, {}]", k.min, k.max);
  return "any";
}

// Type-checks, range-checks and stores one value.
static void set_checked(Config& cfg, const KeySpec& k, Value v, const std::string& where) {
  if (k.type == ValueType::Float && std::holds_alternative<int64_t>(v)) v = static_cast<double>(std::get<int64_t>(v));
  bool ok = (k.type == ValueType::Int && std::holds_alternative<int64_t>(v)) ||
            (k.type == ValueType::Float && std::holds_alternative<double>(v)) ||
            (k.type == ValueType::Bool && std::holds_alternative<bool>(v)) ||
            (k.type == ValueType::String && std::holds_alternative<std::string>(v));
  if (!ok)
    throw ConfigError(
        fmt::format("{}: key '{}' must be a {}, got {}", where, k.path, type_name(k.type), value_to_string(v)));
  double num = 0;
  if (auto* i = std::get_if<int64_t>(&v)) num = static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&v)) num = *d;
  bool numeric = k.type == ValueType::Int || k.type == ValueType::Float;
  if (numeric && k.min <= k.max && (!(num >= k.min && num <= k.max) || std::isnan(num)))
    throw ConfigError(
        fmt::format("{}: key '{}' = {} is out of range; allowed {}", where, k.path, value_to_string(v), range_text(k)));
  if (k.type == ValueType::String) {
    const auto& s = std::get<std::string>(v);
    if (!k.choices.empty() && std::find(k.choices.begin(), k.choices.end(), s) == k.choices.end())
      throw ConfigError(
          fmt::format("{}: key '{}' = \"{}\" is not allowed; allowed {}", where, k.path, s, range_text(k)));
  }
  k.set(cfg, v);
}

static std::optional<Value> node_value(const toml::node& n) {
  if (n.is_integer()) return Value(n.value<int64_t>().value());
  if (n.is_floating_point()) return Value(n.value<double>().value());
  if (n.is_boolean()) return Value(n.value<bool>().value());
  if (n.is_string()) return Value(n.value<std::string>().value());
  return std::nullopt;
}

static void apply_table(Config& cfg, const toml::table& tbl, const std::string& prefix, const std::string& source) {
  for (auto&& [k, node] : tbl) {
    std::string path = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (node.is_table()) {
      apply_table(cfg, *node.as_table(), path, source);
      continue;
    }
    const KeySpec* spec = find_key(path);
    if (!spec)
      throw ConfigError(fmt::format("{}: unknown key '{}' (did you mean '{}'?)", source, path, closest_key(path)));
    auto v = node_value(node);
    if (!v) throw ConfigError(fmt::format("{}: key '{}' must be a {}", source, path, type_name(spec->type)));
    set_checked(cfg, *spec, *v, source);
  }
}

void apply_toml_text(Config& cfg, const std::string& text, const std::string& source) {
  toml::table tbl;
  try {
    tbl = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(fmt::format("{}:{}:{}: TOML syntax error: {}", source, b.line, b.column, e.description()));
  }
  apply_table(cfg, tbl, "", source);
}

Config load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("cannot open config file '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  Config cfg;
  apply_toml_text(cfg, ss.str(), path);
  validate(cfg);
  return cfg;
}

Config resolve_config(const std::string& path, const std::vector<std::string>& sets) {
  Config cfg = path.empty() ? Config{} : load_config(path);
  for (const auto& s : sets) apply_override(cfg, s);
  validate(cfg);
  return cfg;
}

void apply_override(Config& cfg, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw ConfigError(fmt::format("--set '{}': expected KEY=VALUE", assignment));
  std::string path = assignment.substr(0, eq), raw = assignment.substr(eq + 1);
  // one key per --set: a newline would let the TOML parser read further assignments
  if (assignment.find_first_of("\n\r") != std::string::npos)
    throw ConfigError(fmt::format("--set '{}': the value contains a line break", path));
  for (unsigned char c : assignment)
    if (c >= 0x80) {
      try {
        require_utf8(assignment, "--set " + path);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(e.what());
      }
      break;
    }
  const KeySpec* spec = find_key(path);
  if (!spec) throw ConfigError(fmt::format("--set: unknown key '{}' (did you mean '{}'?)", path, closest_key(path)));
  std::optional<Value> v;
  try {  // parse the value as TOML; a bare word for a string key is taken literally
    auto t = toml::parse("v = " + raw);
    v = node_value(*t.get("v"));
  } catch (const toml::parse_error&) {}
  // a string key takes the text as written when it is not a TOML string (--set model.moe.layers=1,3)
  if (spec->type == ValueType::String && (!v || !std::holds_alternative<std::string>(*v))) v = Value(raw);
  if (!v) throw ConfigError(fmt::format("--set: key '{}' must be a {}, got '{}'", path, type_name(spec->type), raw));
  set_checked(cfg, *spec, *v, "--set");
}

bool is_moe_layer(const ModelConfig& m, int64_t layer) { return m.ffn == "moe" && in_moe_layers(m, layer); }

bool in_moe_layers(const ModelConfig& m, int64_t layer) {
  const std::string& p = m.moe.layers;
  if (p == "all") return true;
  if (p == "every_other") return layer % 2 == 1;
  try {
    if (p.rfind("first_dense:", 0) == 0) return layer >= parse_int(p.substr(12), "first_dense");
    const auto list = parse_index_list(p, "model.moe.layers");
    return std::find(list.begin(), list.end(), layer) != list.end();
  } catch (const std::exception&) {}
  throw ConfigError(
      fmt::format("model.moe.layers = \"{}\": expected all, every_other, first_dense:N or a list "
                  "of block indices like \"1,3\"",
                  p));
}

std::vector<int64_t> image_classes(const DataConfig& d) {
  if (d.classes == "all") return {};
  try {
    return parse_index_list(d.classes, "data.classes");
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{} (expected all or a list of class indices like \"0,2,4,6\")", e.what()));
  }
}

int64_t num_moe_layers(const ModelConfig& m) {
  int64_t n = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) n += is_moe_layer(m, i);
  return n;
}

void validate(const Config& c) {
  const auto& m = c.model;
  if (m.ffn == "moe")
    for (int64_t i = 0; i < m.n_layers; ++i) is_moe_layer(m, i);  // pattern check
  if (m.task == "classify") {
    for (const auto k : image_classes(c.data))
      if (k >= m.num_classes)
        throw ConfigError(fmt::format("data.classes = \"{}\": class {} does not exist (model.num_classes = {})",
                                      c.data.classes, k, m.num_classes));
    if (m.image_size % m.patch_size != 0)
      throw ConfigError(
          fmt::format("model.patch_size ({}) must divide model.image_size ({})", m.patch_size, m.image_size));
    if (m.n_kv_heads != m.n_heads)
      throw ConfigError(
          "model.n_kv_heads must equal model.n_heads for model.task = \"classify\" (ViT attention is "
          "plain multi-head)");
    if (m.head_dim != 0 || m.qkv_bias || m.o_bias || m.qk_norm != "none" || m.tie_embeddings)
      throw ConfigError(
          "model.head_dim, qkv_bias, o_bias, qk_norm and tie_embeddings are decoder-LM options; the ViT "
          "(model.task = \"classify\") has its own attention");
  }
  if (m.ffn == "moe") {
    bool any = false;
    for (int64_t i = 0; i < m.n_layers && !any; ++i) any = is_moe_layer(m, i);
    if (!any)
      throw ConfigError(fmt::format("model.moe.layers = \"{}\" selects none of the {} blocks, but model.ffn = \"moe\"",
                                    m.moe.layers, m.n_layers));
  }
  if (c.sample.top_p <= 0)
    throw ConfigError("sample.top_p must be above 0 (it is the probability mass sampled from; 1 = all)");
  if (c.sample.temperature != 0 && c.sample.temperature < 1e-3)
    throw ConfigError(fmt::format("sample.temperature = {} is too small to sample with; use 0 for greedy decoding",
                                  c.sample.temperature));
  if (m.moe.shared_gate && m.moe.n_shared == 0 && m.moe.shared_hidden == 0)
    throw ConfigError("model.moe.shared_gate gates a shared expert: set model.moe.shared_hidden or model.moe.n_shared");
  if (m.head_dim == 0 && m.d_model % m.n_heads != 0)
    throw ConfigError(
        fmt::format("model.d_model ({}) must be divisible by model.n_heads ({}) unless model.head_dim is set",
                    m.d_model, m.n_heads));
  if (m.head_width() % 2 != 0)
    throw ConfigError(
        fmt::format("the head width ({}: model.head_dim, or d_model / n_heads) must be even for RoPE", m.head_width()));
  if (m.n_heads % m.n_kv_heads != 0)
    throw ConfigError(fmt::format("model.n_kv_heads ({}) must divide model.n_heads ({})", m.n_kv_heads, m.n_heads));
  if (c.train.seq_len > m.max_seq_len)
    throw ConfigError(fmt::format("train.seq_len ({}) exceeds model.max_seq_len ({})", c.train.seq_len, m.max_seq_len));
  double w = c.data.weight_dictionary + c.data.weight_scripture + c.data.weight_technical + c.data.weight_quotations;
  if (w <= 0) throw ConfigError("data.weight_*: at least one domain weight must be positive");
  for (auto& check : validators()) check(c);  // the methods' and the model's own checks
}

// One [section] per top-level name, in the order of first appearance (methods register their
// model.* keys after the core sections); nested keys are written dotted (moe.unipool.groups).
std::string to_toml(const Config& cfg) {
  std::vector<std::string> order;
  std::map<std::string, std::string> body;
  for (const auto& k : config_schema()) {
    auto dot = k.path.find('.');
    std::string sec = k.path.substr(0, dot);
    if (!body.count(sec)) order.push_back(sec);
    body[sec] += fmt::format("{} = {}\n", k.path.substr(dot + 1), value_to_string(k.get(cfg)));
  }
  std::string out;
  for (const auto& sec : order) out += (out.empty() ? "" : "\n") + fmt::format("[{}]\n{}", sec, body[sec]);
  return out;
}

std::string schema_markdown() {
  Config defaults;
  std::string out =
      "# Configuration reference\n\nGenerated by `moeforge config --markdown` from the schema in "
      "`src/core/config_schema.cpp`. Unknown keys, wrong types and out-of-range values are errors "
      "that name the key.\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const auto& k : config_schema())
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", k.path, type_name(k.type), value_to_string(k.get(defaults)),
                       range_text(k), k.help);
  if (!aliases().empty()) {
    out +=
        "\nOlder key names, still accepted (configs and checkpoints written before the method sub-tables):\n\n"
        "| old key | now |\n|---|---|\n";
    for (const auto& [old_path, new_path] : aliases()) out += fmt::format("| `{}` | `{}` |\n", old_path, new_path);
  }
  return out;
}

}  // namespace mf
