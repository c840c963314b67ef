#include "data/shards.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "core/util.h"

namespace mf {
namespace {
constexpr char kMagic[8] = {'M', 'F', 'T', 'O', 'K', 'S', '0', '1'};
constexpr size_t kHeader = 32;

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t get_u64(const std::string& s, size_t off) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[off + i])) << (8 * i);
  return v;
}
}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens, uint64_t vocab) {
  std::string out(kMagic, 8);
  put_u64(out, tokens.size());
  put_u64(out, vocab);
  const size_t nbytes = tokens.size() * sizeof(uint16_t);
  put_u64(out, fnv1a64(tokens.data(), nbytes));
  out.append(reinterpret_cast<const char*>(tokens.data()), nbytes);
  write_file_atomic(path, out);
}

std::vector<uint16_t> read_token_shard(const std::string& path, uint64_t vocab) {
  std::string s = read_file(path);
  auto fail = [&](const std::string& why) {
    return std::runtime_error(
        fmt::format("token shard '{}' is corrupt: {} (re-run `moeforge data prepare --force`)", path, why));
  };
  if (s.size() < kHeader || std::memcmp(s.data(), kMagic, 8) != 0) throw fail("bad header");
  uint64_t count = get_u64(s, 8), file_vocab = get_u64(s, 16), sum = get_u64(s, 24);
  if (count > (s.size() - kHeader) / 2 || s.size() != kHeader + count * 2)
    throw fail(fmt::format("size {} does not match {} tokens (truncated?)", s.size(), count));
  if (file_vocab != vocab) throw fail(fmt::format("vocab {} != tokenizer vocab {}", file_vocab, vocab));
  std::vector<uint16_t> tokens(count);
  std::memcpy(tokens.data(), s.data() + kHeader, count * 2);
  if (fnv1a64(tokens.data(), count * 2) != sum) throw fail("checksum mismatch");
  for (auto t : tokens)
    if (t >= vocab) throw fail(fmt::format("token id {} out of range", t));
  return tokens;
}

PreparedCorpus::PreparedCorpus(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  auto mpath = (fs::path(dir) / "manifest.json").string();
  if (!fs::exists(mpath))
    throw std::runtime_error(fmt::format("no prepared corpus in '{}'; run `moeforge data prepare` first", dir));
  try {
    manifest_ = nlohmann::json::parse(read_file(mpath));
    vocab_size_ = manifest_.at("tokenizer").at("vocab_size").get<int64_t>();
    auto expect = manifest_.at("tokenizer").at("checksum").get<std::string>();
    if (file_checksum(tokenizer_path()) != expect)
      throw std::runtime_error("tokenizer.model does not match the manifest checksum");
    for (auto& d : manifest_.at("domains")) {
      domains_.push_back(d.at("name").get<std::string>());
      std::vector<std::vector<uint16_t>> splits;
      for (auto& sp : split_names()) {
        auto& info = d.at("splits").at(sp);
        splits.push_back(read_token_shard((fs::path(dir) / info.at("file").get<std::string>()).string(), vocab_size_));
        if (static_cast<int64_t>(splits.back().size()) != info.at("tokens").get<int64_t>())
          throw std::runtime_error(
              fmt::format("{} {} split token count differs from the manifest", domains_.back(), sp));
      }
      data_.push_back(std::move(splits));
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("corrupt manifest '{}': {}", mpath, e.what()));
  }
}

std::string PreparedCorpus::tokenizer_path() const {
  return (std::filesystem::path(dir_) / "tokenizer.model").string();
}

const std::vector<uint16_t>& PreparedCorpus::tokens(size_t domain, const std::string& split) const {
  for (size_t i = 0; i < split_names().size(); ++i)
    if (split_names()[i] == split) return data_.at(domain)[i];
  throw std::invalid_argument("unknown split " + split);
}

BatchSampler::BatchSampler(const PreparedCorpus& c, std::vector<double> weights, int64_t seq_len, uint64_t seed)
    : corpus_(c), seq_len_(seq_len), seed_(seed) {
  if (weights.size() != c.domains().size()) throw std::invalid_argument("one mixture weight per domain expected");
  double acc = 0;
  for (size_t d = 0; d < weights.size(); ++d) {
    auto n = static_cast<int64_t>(c.tokens(d, "train").size());
    if (weights[d] > 0 && n < seq_len + 1)
      throw std::runtime_error(
          fmt::format("domain '{}' has {} training tokens, fewer than seq_len+1", c.domains()[d], n));
    acc += weights[d];
    cumulative_.push_back(acc);
  }
  if (acc <= 0) throw std::invalid_argument("mixture weights sum to zero");
  for (auto& w : cumulative_) w /= acc;
}

Batch BatchSampler::sample(int64_t step, int64_t micro, int64_t B) const {
  auto inputs = at::empty({B, seq_len_}, at::kLong), targets = at::empty({B, seq_len_}, at::kLong);
  auto* in = inputs.data_ptr<int64_t>();
  auto* tg = targets.data_ptr<int64_t>();
  SplitMix64 rng(mix_seed(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro)));
  for (int64_t b = 0; b < B; ++b) {
    double u = rng.uniform();
    size_t d = 0;
    while (d + 1 < cumulative_.size() && u >= cumulative_[d]) ++d;
    const auto& toks = corpus_.tokens(d, "train");
    uint64_t start = rng.below(toks.size() - seq_len_);
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[b * seq_len_ + t] = toks[start + t];
      tg[b * seq_len_ + t] = toks[start + t + 1];
    }
  }
  return {inputs, targets};
}

template <class Token>
static Batch windows_of(const std::vector<Token>& toks, int64_t seq_len, int64_t windows) {
  if (static_cast<int64_t>(toks.size()) < seq_len + 1)
    throw std::runtime_error(fmt::format("split has {} tokens, fewer than seq_len+1 = {}", toks.size(), seq_len + 1));
  auto inputs = at::empty({windows, seq_len}, at::kLong), targets = at::empty({windows, seq_len}, at::kLong);
  auto* in = inputs.data_ptr<int64_t>();
  auto* tg = targets.data_ptr<int64_t>();
  const int64_t span = static_cast<int64_t>(toks.size()) - seq_len - 1;
  for (int64_t w = 0; w < windows; ++w) {
    int64_t start = windows > 1 ? span * w / (windows - 1) : 0;
    for (int64_t t = 0; t < seq_len; ++t) {
      in[w * seq_len + t] = toks[start + t];
      tg[w * seq_len + t] = toks[start + t + 1];
    }
  }
  return {inputs, targets};
}

Batch fixed_windows(const std::vector<uint16_t>& toks, int64_t seq_len, int64_t windows) {
  return windows_of(toks, seq_len, windows);
}
Batch fixed_windows(const std::vector<int>& toks, int64_t seq_len, int64_t windows) {
  return windows_of(toks, seq_len, windows);
}

}  // namespace mf
