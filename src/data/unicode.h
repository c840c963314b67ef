// UTF-8 checks, Unicode normalisation (utf8proc) and GPT-2's byte <-> character map.
#pragma once
#include <array>
#include <string>
#include <string_view>

#include "core/util.h"

namespace mf {

// (UTF-8 validation: invalid_utf8_at / require_utf8 in core/util.h)
// Invalid sequences become U+FFFD, one per maximal invalid subpart (Rust's from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

// NFC and NFKC as Hugging Face's `tokenizers` computes them: with Unicode 9.0's tables, so the
// 245 code points assigned since that it would touch (scripts/unicode9_table.py: combining
// marks such as U+07FD, composites, compatibility characters) are left as they are.
// s must be valid UTF-8.
std::string nfc(std::string_view s);
std::string nfkc(std::string_view s);

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100 and up, in byte order. `byte_char[b]` is the UTF-8 of the character for byte b.
const std::array<std::string, 256>& byte_chars();
// Inverse: the byte of one such character given as a code point, or -1.
int char_byte(char32_t c);

void append_utf8(std::string& out, char32_t c);
// Decodes the code point at s[i] (valid UTF-8 assumed) and advances i.
char32_t next_code_point(std::string_view s, size_t& i);

}  // namespace mf
