#include "data/tokenizer.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

#include "core/util.h"
#include "data/hf_tokenizer.h"
#include "io/safetensors.h"  // FormatError

namespace mf {
namespace {

struct Shim {
  void* (*load)(const char*, char*, size_t);
  void (*free_handle)(void*);
  int (*info)(void*, int);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t);
  int (*train)(const char*, const char*, size_t, unsigned, char**, size_t*, char*, size_t);
  int (*piece)(void*, int, const char**, size_t*, float*);
};

std::string find_shim() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("MOEFORGE_SPM_SHIM")) candidates.emplace_back(env);
  std::error_code ec;
  auto exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (!ec) {
    candidates.push_back(exe_dir / "libmoeforge_spm.so");
    candidates.push_back(exe_dir.parent_path() / "libmoeforge_spm.so");               // tests/ next to it
    candidates.push_back(exe_dir.parent_path() / "lib/moeforge/libmoeforge_spm.so");  // installed
  }
#ifdef MOEFORGE_SPM_SHIM_BUILD_PATH
  candidates.emplace_back(MOEFORGE_SPM_SHIM_BUILD_PATH);
#endif
  for (auto& c : candidates)
    if (fs::exists(c)) return c.string();
  throw std::runtime_error(
      "libmoeforge_spm.so (the SentencePiece shim) not found next to the executable; "
      "set MOEFORGE_SPM_SHIM to its path");
}

const Shim& shim() {
  static Shim s;
  static std::once_flag once;
  std::call_once(once, [] {
    auto path = find_shim();
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!lib) throw std::runtime_error(fmt::format("cannot load {}: {}", path, ::dlerror()));
    auto sym = [&](const char* name) {
      void* p = ::dlsym(lib, name);
      if (!p) throw std::runtime_error(fmt::format("{} lacks symbol {}", path, name));
      return p;
    };
    s.load = reinterpret_cast<decltype(s.load)>(sym("mfspm_load"));
    s.free_handle = reinterpret_cast<decltype(s.free_handle)>(sym("mfspm_free"));
    s.info = reinterpret_cast<decltype(s.info)>(sym("mfspm_info"));
    s.encode = reinterpret_cast<decltype(s.encode)>(sym("mfspm_encode"));
    s.decode = reinterpret_cast<decltype(s.decode)>(sym("mfspm_decode"));
    s.train = reinterpret_cast<decltype(s.train)>(sym("mfspm_train"));
    s.piece = reinterpret_cast<decltype(s.piece)>(sym("mfspm_piece"));
  });
  return s;
}

}  // namespace

Tokenizer::Tokenizer(const std::string& path) {
  char err[512] = "";
  if (!std::filesystem::exists(path)) throw std::runtime_error(fmt::format("tokenizer '{}' not found", path));
  // a file that is there but cannot be used is a malformed input (FormatError: exit 3)
  if (std::filesystem::path(path).extension() == ".json") {
    try {
      hf_ = std::make_unique<HfTokenizer>(path);
    } catch (const std::invalid_argument& e) {
      throw FormatError(e.what());
    }
    return;
  }
  handle_ = shim().load(path.c_str(), err, sizeof err);
  if (!handle_) throw FormatError(fmt::format("cannot load tokenizer '{}': {}", path, err));
}

Tokenizer::~Tokenizer() {
  if (handle_) shim().free_handle(handle_);
}

std::vector<int> Tokenizer::encode(const std::string& text) const {
  if (hf_) return hf_->encode(text);
  int* ids = nullptr;
  size_t n = 0;
  char err[512] = "";
  if (shim().encode(handle_, text.data(), text.size(), &ids, &n, err, sizeof err) != 0)
    throw std::runtime_error(std::string("tokenizer encode failed: ") + err);
  std::vector<int> out(ids, ids + n);
  std::free(ids);
  return out;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  if (hf_) return hf_->decode(ids);
  char* text = nullptr;
  size_t n = 0;
  char err[512] = "";
  if (shim().decode(handle_, ids.data(), ids.size(), &text, &n, err, sizeof err) != 0)
    throw std::runtime_error(std::string("tokenizer decode failed: ") + err);
  std::string out(text, n);
  std::free(text);
  return out;
}

Tokenizer::Piece Tokenizer::piece(int id) const {
  if (hf_) throw std::logic_error("Tokenizer::piece: a SentencePiece model's only");
  if (id < 0 || id >= vocab_size()) throw std::out_of_range(fmt::format("token id {} outside the vocabulary", id));
  const char* text = nullptr;
  size_t len = 0;
  Piece p;
  p.type = shim().piece(handle_, id, &text, &len, &p.score);
  p.text.assign(text, len);
  return p;
}

int Tokenizer::vocab_size() const { return hf_ ? hf_->vocab_size() : shim().info(handle_, 0); }
int Tokenizer::eos_id() const { return hf_ ? hf_->eos_id() : shim().info(handle_, 1); }
int Tokenizer::bos_id() const { return hf_ ? hf_->bos_id() : shim().info(handle_, 2); }

std::string tokenizer_in(const std::string& dir) {
  for (const char* name : {"tokenizer.model", "tokenizer.json"}) {
    const auto p = std::filesystem::path(dir) / name;
    if (std::filesystem::is_regular_file(p)) return p.string();
  }
  return "";
}

void copy_tokenizer(const std::string& file, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path from(file);
  write_file_atomic((fs::path(dir) / from.filename()).string(), read_file(file));
  const auto config = from.parent_path() / "tokenizer_config.json";
  if (from.extension() == ".json" && fs::is_regular_file(config))
    write_file_atomic((fs::path(dir) / config.filename()).string(), read_file(config.string()));
}

// SentencePiece logs to stderr through its own logger; send it to a file instead.
struct StderrToFile {
  int saved;
  explicit StderrToFile(const std::string& path) : saved(::dup(STDERR_FILENO)) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) ::dup2(fd, STDERR_FILENO), ::close(fd);
  }
  ~StderrToFile() { ::dup2(saved, STDERR_FILENO), ::close(saved); }
};

void train_tokenizer(const std::string& sample, const std::string& model_path, int vocab, const std::string& log) {
  // identity normalization and kept whitespace: code indentation survives; newlines
  // become byte-fallback tokens since training sentences are single lines
  std::string args = fmt::format(
      "--vocab_size={} --model_type=bpe --byte_fallback=true "
      "--character_coverage=0.9995 --normalization_rule_name=identity --remove_extra_whitespaces=false "
      "--allow_whitespace_only_pieces=true --split_digits=true --max_sentence_length=16384 "
      "--input_sentence_size=0 --shuffle_input_sentence=false --num_threads=2 "
      "--unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --hard_vocab_limit=false",
      vocab);
  char err[512] = "";
  char* model = nullptr;
  size_t model_len = 0;
  int rc;
  {
    StderrToFile redirect(log);
    rc = shim().train(args.c_str(), sample.data(), sample.size(), 20251129u, &model, &model_len, err, sizeof err);
  }
  if (rc != 0) throw std::runtime_error(fmt::format("tokenizer training failed: {} (see {})", err, log));
  std::string bytes(model, model_len);
  std::free(model);
  write_file_atomic(model_path, bytes);
}

}  // namespace mf
