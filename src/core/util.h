// Small shared utilities: files written atomically, checksums, a seeded RNG,
// logging setup and a terminal progress bar.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mf {

// temp file in the same directory, fsync, rename, fsync directory.
void write_file_atomic(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);
void fsync_dir(const std::string& dir);
void fsync_file(const std::string& path);

// FNV-1a 64: detects changed inputs for idempotent data preparation.
// (Change detection, not security, so a cryptographic hash library is not needed.)
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 14695981039346656037ULL);
std::string file_checksum(const std::string& path);  // hex of fnv1a64 over contents
std::string hex64(uint64_t v);

// SplitMix64: tiny, fully specified, so data order is reproducible across
// platforms and library versions (std:: distributions are not).
struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
};
uint64_t mix_seed(uint64_t a, uint64_t b, uint64_t c = 0);

// UTF-8: the length of the valid sequence starting at s[i], or 0 with `bad` = the bytes of
// the maximal invalid subpart (Unicode's recommended practice, which Rust also follows).
size_t utf8_sequence_length(std::string_view s, size_t i, size_t& bad);
// Byte offset of the first byte that does not start a valid UTF-8 sequence, or npos.
size_t invalid_utf8_at(std::string_view s);
// Throws std::invalid_argument naming `what` and the offset when `s` is not valid UTF-8.
void require_utf8(std::string_view s, const std::string& what);

// Whole-string integer: "12" -> 12; "12x", "", " 12" or out of range throw
// std::invalid_argument naming `what`.
int64_t parse_int(const std::string& text, const std::string& what);
// "1,3,5" -> {1, 3, 5}: comma-separated whole-string integers >= 0, at least one; anything else
// throws std::invalid_argument naming `what`.
std::vector<int64_t> parse_index_list(const std::string& text, const std::string& what);

// How deep JSON `text` nests ([ and { outside strings): checked before parsing untrusted
// JSON, since a million nested arrays would overflow the stack of anything recursive.
size_t json_depth(std::string_view text);
constexpr size_t kMaxJsonDepth = 64;

// Test hook for the kill harness (tests/reliability/kill_resume.sh): when MOEFORGE_FAILPOINT
// is "NAME" or "NAME@K", the process kills itself with SIGKILL at the K-th (default first)
// time it reaches the point called NAME. Costs one comparison when unset.
void failpoint(const char* name);

void setup_logging(bool verbose);
bool stderr_is_tty();
std::string format_duration(double seconds);  // 83 -> "01:23"

// Progress bar with ETA on a TTY; on a pipe, a plain line at every 10 %.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  void update(int64_t done, const std::string& suffix = "");
  void finish(const std::string& suffix = "");
  double elapsed() const;

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  int last_decile_ = -1;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace mf
