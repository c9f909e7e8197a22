// The GPT-2 byte-to-unicode alphabet used by byte-level BPE.
//
// Every byte gets a printable code point so that tokens are readable strings without spaces or
// control characters: printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
// themselves and the remaining 68 bytes map to U+0100 onwards in byte order (' ' -> 'Ġ', '\n' ->
// 'Ċ').
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace specula::byte_level {

// UTF-8 of the code point that stands for `byte`.
std::string_view ByteToChar(uint8_t byte);

// The byte a code point stands for, or -1 if it is not in the alphabet.
int CharToByte(int cp);

// Maps every byte of `bytes` to its character.
std::string Encode(std::string_view bytes);

// Appends the bytes that the characters of `token` stand for. Returns false (appending nothing) if
// a character is not in the alphabet, e.g. an added token like "<|im start|>" that contains a
// space.
bool Decode(std::string_view token, std::string* out);

}  // namespace specula::byte_level
