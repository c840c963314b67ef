#include "methods/umoe/calibration.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "core/util.h"
#include "data/corpus.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"

namespace mf {
namespace fs = std::filesystem;

std::string calibration_label(const std::string& source) {
  if (source.rfind("domain:", 0) == 0) return source.substr(7);
  return fs::path(source).stem().string();
}

at::Tensor calibration_windows(const CalibrationSource& s, const Config& cfg, const std::string& tokenizer_path) {
  const int64_t L = s.seq_len > 0 ? s.seq_len : cfg.train.seq_len;
  if (s.samples < 1) throw std::invalid_argument("--samples must be at least 1");
  std::vector<int> tokens;  // int, not the shards' uint16: a Hugging Face vocabulary is larger
  const bool named = s.source.rfind("domain:", 0) == 0;
  if (!named && fs::is_regular_file(s.source)) {
    if (fs::path(s.source).extension() == ".bin") {
      const auto shard = read_token_shard(s.source, static_cast<uint64_t>(cfg.model.vocab_size));
      tokens.assign(shard.begin(), shard.end());
    } else {
      tokens = Tokenizer(tokenizer_path).encode(read_file(s.source));
    }
  } else {
    const std::string domain = calibration_label(s.source);
    const std::string dir = s.data_dir.empty() ? cfg.data.dir : s.data_dir;
    std::vector<std::string> known;
    for (const auto& d : builtin_domains()) known.push_back(d.name);
    if (std::find(known.begin(), known.end(), domain) == known.end())
      throw std::invalid_argument(
          fmt::format("calibration source '{}' is neither a file nor a domain of the corpus at '{}' ({})", s.source,
                      dir, fmt::join(known, ", ")));
    if (const auto corpus = corpus_for_model(dir, cfg.model.vocab_size)) {
      const auto& names = corpus->domains();
      const auto it = std::find(names.begin(), names.end(), domain);
      if (it == names.end())
        throw std::invalid_argument(fmt::format("calibration source '{}': the corpus at '{}' has no such domain ({})",
                                                s.source, dir, fmt::join(names, ", ")));
      const auto& shard = corpus->tokens(static_cast<size_t>(it - names.begin()), "train");
      tokens.assign(shard.begin(), shard.end());
    } else {  // a model with its own tokenizer: the domain's training documents, encoded with it
      tokens = retokenized_split(cfg.data, Tokenizer(tokenizer_path), "train", domain).front().second;
    }
  }
  if (static_cast<int64_t>(tokens.size()) < L + 1)
    throw std::invalid_argument(fmt::format("calibration source '{}' has {} tokens, fewer than one window of {} + 1",
                                            s.source, tokens.size(), L));
  return fixed_windows(tokens, L, s.samples).inputs;
}

}  // namespace mf
