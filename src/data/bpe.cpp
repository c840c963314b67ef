#include "data/bpe.h"

#include <fmt/format.h>

#include <queue>
#include <stdexcept>

#include "data/unicode.h"

namespace mf {

Bpe::Bpe(std::unordered_map<std::string, int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         bool ignore_merges)
    : vocab_(std::move(vocab)), ignore_merges_(ignore_merges) {
  const auto& chars = byte_chars();
  for (int b = 0; b < 256; ++b) {
    byte_id_[b] = id(chars[b]);
    if (byte_id_[b] < 0)
      throw std::invalid_argument(
          fmt::format("vocabulary lacks '{}', the byte-level character of byte 0x{:02X}", chars[b], b));
  }
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int ia = id(a), ib = id(b), merged = id(a + b);
    if (ia < 0 || ib < 0 || merged < 0)
      throw std::invalid_argument(fmt::format("merge {} '{} {}': '{}' is not in the vocabulary", rank, a, b,
                                              ia < 0   ? a
                                              : ib < 0 ? b
                                                       : a + b));
    merges_.emplace(key(ia, ib), Merge{static_cast<int>(rank), merged});  // a repeated pair keeps its first rank
  }
}

int Bpe::id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const Bpe::Merge* Bpe::find(int a, int b) const {
  const auto it = merges_.find(key(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

// Repeatedly merge the adjacent pair of lowest rank (leftmost among equal ranks). A heap
// of candidate merges with lazy invalidation keeps long pieces O(n log n).
void Bpe::merge_word(std::string_view piece, std::vector<int>& out) const {
  const int n = static_cast<int>(piece.size());
  std::vector<int> sym(n), prev(n), next(n);
  for (int i = 0; i < n; ++i) sym[i] = byte_id_[static_cast<unsigned char>(piece[i])], prev[i] = i - 1, next[i] = i + 1;
  next[n - 1] = -1;
  struct Candidate {
    int rank, pos;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto offer = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    if (const Merge* m = find(sym[left], sym[next[left]])) heap.push({m->rank, left});
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = sym[c.pos] < 0 ? -1 : next[c.pos];
    if (right < 0) continue;
    const Merge* m = find(sym[c.pos], sym[right]);
    if (!m || m->rank != c.rank) continue;  // stale: a neighbour changed since it was offered
    sym[c.pos] = m->id;
    sym[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    offer(prev[c.pos]);
    offer(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(sym[i]);
}

void Bpe::encode(std::string_view piece, std::vector<int>& out) const {
  if (piece.empty()) return;
  const std::string word(piece);
  {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> ids;
  if (ignore_merges_) {
    std::string chars;
    for (char b : piece) chars += byte_chars()[static_cast<unsigned char>(b)];
    if (const int whole = id(chars); whole >= 0) ids.push_back(whole);
  }
  if (ids.empty()) merge_word(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  std::lock_guard lock(cache_mutex_);
  if (cache_.size() < kCacheLimit) cache_.emplace(word, std::move(ids));
}

}  // namespace mf
