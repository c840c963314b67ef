#include "data/corpus.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "core/util.h"

namespace mf {
namespace fs = std::filesystem;

const std::vector<DomainSource>& builtin_domains() {
  static const std::vector<DomainSource> d = {
      {"dictionary", "dict-gcide", {"usr/share/dictd/gcide.dict.dz"}},
      {"scripture", "bible-kjv bible-kjv-text", {"usr/lib/bible.data"}},
      {"technical", "c++-annotations-txt", {"usr/share/doc/c++-annotations/cplusplus.txt.gz"}},
      {"quotations", "fortunes", {"usr/share/games/fortunes"}},
  };
  return d;
}

std::string read_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(fmt::format("cannot open '{}'", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const char* msg = gzerror(f, &err);
  std::string why = err < 0 ? msg : "";
  gzclose(f);
  if (n < 0 || !why.empty()) throw std::runtime_error(fmt::format("corrupt gzip file '{}': {}", path, why));
  return out;
}

static size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 0;
}

std::string sanitize_text(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    auto c = static_cast<unsigned char>(in[i]);
    if (c == '\b') {  // overstrike: "_\bX" or "X\bX" prints X
      if (!out.empty() && static_cast<unsigned char>(out.back()) < 0x80) out.pop_back();
      ++i;
      continue;
    }
    if (c < 0x80) {
      if (c == '\n')
        out += '\n';
      else if (c == '\t')
        out += ' ';
      else if (c >= 0x20 && c != 0x7f)
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t len = utf8_length(c);
    bool ok = len > 1 && i + len <= in.size();
    for (size_t j = 1; ok && j < len; ++j) ok = (static_cast<unsigned char>(in[i + j]) >> 6) == 0x2;
    if (ok) out.append(in, i, len);
    i += ok ? len : 1;
  }
  return out;
}

static std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \n");
  if (b == std::string::npos) return "";
  auto e = s.find_last_not_of(" \n");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> parse_gcide(const std::string& text) {
  static const std::regex pron(R"(\\[^\\\n]*\\)");  // \Al"ley*way`\ .
  static const std::regex tags(R"(\[(1913 Webster|WordNet[^\]]*|PJC|Century Dict\.|Webster 1913 Suppl\.)\])");
  static const std::regex spaces(R"( {2,})");
  std::vector<std::string> docs;
  std::string cur;
  auto flush = [&] {
    std::string d = trim(cur);
    cur.clear();
    if (d.empty() || d.rfind("00-database", 0) == 0 || d.find("Begin file") != std::string::npos ||
        d.find("* * *") != std::string::npos)
      return;
    d = std::regex_replace(d, pron, "");
    d = std::regex_replace(d, tags, "");
    d.erase(std::remove_if(d.begin(), d.end(), [](char c) { return c == '{' || c == '}'; }), d.end());
    d = std::regex_replace(d, spaces, " ");
    std::string lines, line;
    std::istringstream ss(d);
    while (std::getline(ss, line)) {  // strip indentation and empty lines left by removed tags
      line = trim(line);
      if (!line.empty()) lines += (lines.empty() ? "" : "\n") + line;
    }
    if (!lines.empty()) docs.push_back(lines);
  };
  std::istringstream in(text);
  std::string line, prev = "";
  while (std::getline(in, line)) {
    bool starts_entry = !line.empty() && line[0] != ' ' && prev.empty();
    if (starts_entry) flush();
    cur += line + "\n";
    prev = trim(line);
  }
  flush();
  return docs;
}

std::vector<std::string> parse_bible(const std::string& text) {
  static const std::regex verse(R"(^\s*\d+\s+)");
  std::vector<std::string> docs;
  std::string cur, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (trim(line).empty()) continue;
    if (line[0] != ' ') {  // "Genesis 1": a new chapter
      if (!cur.empty()) docs.push_back(cur);
      cur = trim(line);
      continue;
    }
    cur += "\n" + std::regex_replace(line, verse, "");
  }
  if (!cur.empty()) docs.push_back(cur);
  return docs;
}

std::vector<std::string> parse_fortunes(const std::string& text) {
  std::vector<std::string> docs;
  std::string cur, line;
  std::istringstream in(text);
  auto flush = [&] {
    auto t = trim(cur);
    if (!t.empty()) docs.push_back(t);
    cur.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%")
      flush();
    else
      cur += line + "\n";
  }
  flush();
  return docs;
}

std::vector<std::string> parse_paragraphs(const std::string& text, size_t min_bytes) {
  std::vector<std::string> docs;
  std::string cur, para, line;
  std::istringstream in(text);
  auto end_para = [&] {
    if (!trim(para).empty()) cur += para + "\n";
    para.clear();
    if (cur.size() >= min_bytes) docs.push_back(trim(cur)), cur.clear();
  };
  while (std::getline(in, line)) {
    if (trim(line).empty())
      end_para();
    else
      para += line + "\n";
  }
  end_para();
  if (!trim(cur).empty()) docs.push_back(trim(cur));
  return docs;
}

static std::string run_bible(const std::string& root) {
  std::string cmd = "bible -l0";
  if (root != "/" && !root.empty()) cmd += " -p '" + (fs::path(root) / "usr/lib").string() + "'";
  cmd += " Gen1:1-Rev22:21 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run the 'bible' program (package bible-kjv)");
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0 || out.size() < 1000)
    throw std::runtime_error("the 'bible' program failed; install bible-kjv and bible-kjv-text (scripts/setup.sh)");
  return out;
}

std::vector<std::string> extract_domain(const DomainSource& d, const std::string& root, int64_t max_bytes) {
  for (const auto& f : d.files)
    if (!fs::exists(fs::path(root) / f))
      throw std::runtime_error(
          fmt::format("domain '{}': '{}' not found; install Debian package(s) {} "
                      "(scripts/setup.sh does)",
                      d.name, (fs::path(root) / f).string(), d.package));
  std::vector<std::string> docs;
  const auto path = [&](size_t i) { return (fs::path(root) / d.files[i]).string(); };
  // a capped run only needs the beginning of a source (markup takes up to ~half of it)
  const auto head = [&](std::string s) {
    if (max_bytes > 0 && s.size() > static_cast<size_t>(2 * max_bytes)) s.resize(2 * max_bytes);
    return sanitize_text(s);
  };
  if (d.name == "dictionary")
    docs = parse_gcide(head(read_gzip(path(0))));
  else if (d.name == "scripture")
    docs = parse_bible(head(run_bible(root)));
  else if (d.name == "technical")
    docs = parse_paragraphs(head(read_gzip(path(0))), 1500);
  else if (d.name == "quotations") {
    std::vector<fs::path> files;
    for (auto& e : fs::directory_iterator(path(0)))
      if (e.is_regular_file() && !e.path().has_extension()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (auto& f : files)
      for (auto& q : parse_fortunes(sanitize_text(read_file(f.string())))) docs.push_back(std::move(q));
  } else {
    throw std::runtime_error("unknown domain " + d.name);
  }
  if (max_bytes > 0) {
    int64_t total = 0;
    size_t keep = 0;
    while (keep < docs.size() && total < max_bytes) total += static_cast<int64_t>(docs[keep++].size());
    docs.resize(keep);
  }
  return docs;
}

}  // namespace mf
