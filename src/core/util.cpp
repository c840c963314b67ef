#include "core/util.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mf {
namespace fs = std::filesystem;

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(fmt::format("fsync of '{}' failed", path));
  }
  ::close(fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::string tmp = path + fmt::format(".tmp.{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot create '{}'", tmp));
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw std::runtime_error(fmt::format("write to '{}' failed (disk full?)", tmp));
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("fsync of '{}' failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("cannot rename '{}' to '{}'", tmp, path));
  }
  fsync_dir(p.has_parent_path() ? p.parent_path().string() : ".");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open '{}'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t utf8_sequence_length(std::string_view s, size_t i, size_t& bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF)
    n = 2;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
  else
    return 0;
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char x = b(i + k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return 0;
    bad = k + 1;
  }
  return n;
}

size_t invalid_utf8_at(std::string_view s) {
  size_t bad;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i, bad);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, const std::string& what) {
  const size_t at = invalid_utf8_at(s);
  if (at != std::string_view::npos)
    throw std::invalid_argument(
        fmt::format("{} is not valid UTF-8: byte 0x{:02X} at offset {}", what, static_cast<unsigned char>(s[at]), at));
}

void failpoint(const char* name) {
  static const char* spec = std::getenv("MOEFORGE_FAILPOINT");
  if (!spec) return;
  static int hits = 0;
  const std::string s(spec);
  const auto at = s.find('@');
  if (s.substr(0, at) != name) return;
  const int wanted = at == std::string::npos ? 1 : static_cast<int>(parse_int(s.substr(at + 1), "MOEFORGE_FAILPOINT"));
  if (++hits == wanted) std::raise(SIGKILL);
}

int64_t parse_int(const std::string& text, const std::string& what) {
  int64_t v = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw std::invalid_argument(fmt::format("{}: '{}' is not an integer", what, text));
  return v;
}

std::vector<int64_t> parse_index_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    out.push_back(parse_int(item, what));
    if (out.back() < 0) throw std::invalid_argument(fmt::format("{}: '{}' is negative", what, item));
  }
  if (out.empty() || text.back() == ',')
    throw std::invalid_argument(fmt::format("{}: '{}' is not a list like \"1,3\"", what, text));
  return out;
}

size_t json_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

std::string file_checksum(const std::string& path) {
  std::string s = read_file(path);
  return hex64(fnv1a64(s.data(), s.size()));
}

uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c) {
  SplitMix64 r(a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL) * 0xD1B54A32D192ED03ULL ^
               (c + 0x8CB92BA72F3D8DD7ULL) * 0xABC98388FB8FAC03ULL);
  r.next();
  return r.next();
}

void setup_logging(bool verbose) {
  static bool done = false;
  if (!done) {
    auto logger = spdlog::stderr_color_mt("moeforge");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
    done = true;
  }
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
}

bool stderr_is_tty() { return ::isatty(STDERR_FILENO) == 1; }

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, (t / 60) % 60, t % 60);
  return fmt::format("{:02}:{:02}", t / 60, t % 60);
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      tty_(stderr_is_tty()),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - std::chrono::seconds(1)) {}

double Progress::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& suffix) {
  double frac = std::min(1.0, static_cast<double>(done) / total_);
  double el = elapsed();
  double eta = done > 0 ? el * (total_ - done) / done : -1;
  if (tty_) {
    auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 28;
    int filled = static_cast<int>(frac * kWidth);
    std::string bar(filled, '#');
    bar += std::string(kWidth - filled, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %lld/%lld %s<%s %s", label_.c_str(), bar.c_str(), frac * 100,
                 static_cast<long long>(done), static_cast<long long>(total_), format_duration(el).c_str(),
                 format_duration(eta).c_str(), suffix.c_str());
    std::fflush(stderr);
  } else {
    int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    spdlog::info("{} {:3.0f}% ({}/{}) elapsed {} eta {} {}", label_, frac * 100, done, total_, format_duration(el),
                 format_duration(eta), suffix);
  }
}

void Progress::finish(const std::string& suffix) {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    last_draw_ = {};
    update(total_, suffix);
    std::fprintf(stderr, "\n");
  } else {
    spdlog::info("{} done in {} {}", label_, format_duration(elapsed()), suffix);
  }
}

}  // namespace mf
