// UTF-8 scanning helpers shared by the tokenizer pieces.
//
// Tokenizer input is arbitrary bytes: ill-formed sequences are never rejected, they are carried
// through byte by byte (byte-level BPE stays lossless) and only replaced with U+FFFD when decoded
// text is handed to a caller.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace specula::utf8 {

// Length of the well-formed sequence that starts at s[pos], or 0 if the bytes there do not form one
// (bad lead byte, bad continuation, or truncated by the end of `s`).
size_t ValidCharLength(std::string_view s, size_t pos);

// Length of one "character" for splitting text into symbols: the well-formed sequence at `pos`, or
// a single byte where the input is ill-formed.
inline size_t CharLength(std::string_view s, size_t pos) {
  const size_t n = ValidCharLength(s, pos);
  return n == 0 ? 1 : n;
}

// Code point of the well-formed sequence at `pos`; -1 if ill-formed. `length` receives
// CharLength().
int DecodeAt(std::string_view s, size_t pos, size_t* length);

// Appends the UTF-8 encoding of `cp` (a valid scalar value).
void Append(char32_t cp, std::string* out);

bool IsValid(std::string_view s);

// Replaces each maximal ill-formed subsequence with U+FFFD, exactly as Python's
// bytes.decode(errors="replace") and Rust's String::from_utf8_lossy do.
std::string ToValid(std::string_view bytes);

// Number of trailing bytes (0..3) that are a well-formed but unfinished sequence: bytes a streaming
// decoder must hold back because the next token may complete them.
size_t IncompleteTailLength(std::string_view bytes);

// Unicode White_Space property (what Rust's char::is_whitespace tests).
bool IsWhitespace(int cp);

// Byte offset where the run of whitespace that ends `s` starts (s.size() if `s` does not end in
// whitespace).
size_t TrailingWhitespaceStart(std::string_view s);

// Byte length of the run of whitespace that starts `s`.
size_t LeadingWhitespaceLength(std::string_view s);

}  // namespace specula::utf8
