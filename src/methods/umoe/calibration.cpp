#include "methods/umoe/calibration.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>

#include "core/util.h"
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
  std::vector<uint16_t> tokens;
  const bool named = s.source.rfind("domain:", 0) == 0;
  if (!named && fs::is_regular_file(s.source)) {
    if (fs::path(s.source).extension() == ".bin") {
      tokens = read_token_shard(s.source, static_cast<uint64_t>(cfg.model.vocab_size));
    } else {
      Tokenizer tok(tokenizer_path);
      for (int id : tok.encode(read_file(s.source))) tokens.push_back(static_cast<uint16_t>(id));
    }
  } else {
    const std::string domain = calibration_label(s.source);
    const std::string dir = s.data_dir.empty() ? cfg.data.dir : s.data_dir;
    std::unique_ptr<PreparedCorpus> corpus;
    try {
      corpus = std::make_unique<PreparedCorpus>(dir);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format(
          "calibration source '{}' is not a file, and the prepared corpus at '{}' that would hold a domain of that "
          "name cannot be read ({})",
          s.source, dir, e.what()));
    }
    const auto& names = corpus->domains();
    auto it = std::find(names.begin(), names.end(), domain);
    if (it == names.end())
      throw std::invalid_argument(
          fmt::format("calibration source '{}' is neither a file nor a domain of the corpus at '{}' ({})", s.source,
                      dir, fmt::join(names, ", ")));
    tokens = corpus->tokens(static_cast<size_t>(it - names.begin()), "train");
  }
  if (static_cast<int64_t>(tokens.size()) < L + 1)
    throw std::invalid_argument(fmt::format("calibration source '{}' has {} tokens, fewer than one window of {} + 1",
                                            s.source, tokens.size(), L));
  return fixed_windows(tokens, L, s.samples).inputs;
}

}  // namespace mf
