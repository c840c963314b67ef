// The built-in multi-domain corpus: one domain per Debian package, extracted to plain
// documents with format markup removed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mf {

struct DomainSource {
  std::string name;                // dictionary, scripture, technical, quotations
  std::string package;             // the Debian package(s) it comes from
  std::vector<std::string> files;  // input files under source_root (for fingerprints)
};

const std::vector<DomainSource>& builtin_domains();

// Extracts the documents of one domain. `max_bytes` > 0 stops after that much text
// (quick tests); throws std::runtime_error with an install hint if inputs are missing.
std::vector<std::string> extract_domain(const DomainSource& d, const std::string& source_root, int64_t max_bytes);

// Drops control characters (keeps \n, turns \t into a space), resolves backspace
// overstriking, and removes bytes that are not valid UTF-8.
std::string sanitize_text(const std::string& in);

// GCIDE dictd text -> one document per entry, without pronunciation, braces and source tags.
std::vector<std::string> parse_gcide(const std::string& text);
// output of `bible -l0` -> one document per chapter, verse numbers removed
std::vector<std::string> parse_bible(const std::string& text);
// fortune file -> one document per quotation ('%' separated)
std::vector<std::string> parse_fortunes(const std::string& text);
// plain text -> paragraphs grouped into documents of at least `min_bytes`
std::vector<std::string> parse_paragraphs(const std::string& text, size_t min_bytes);

std::string read_gzip(const std::string& path);

}  // namespace mf
