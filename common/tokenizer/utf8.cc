#include "common/tokenizer/utf8.h"

#include <cstdint>

namespace specula::utf8 {
namespace {

struct SequenceScan {
  size_t needed;  // total length the lead byte announces; 0 for a byte that cannot start a sequence
  size_t
      matched;  // bytes (lead included) that fit the well-formed pattern before `s` ends or breaks
};

// Follows Unicode Table 3-7 (well-formed byte sequences), so overlong forms and surrogates count as
// ill-formed, and the matched prefix is the "maximal subpart" used for U+FFFD substitution.
SequenceScan Scan(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {1, 1};
  size_t needed = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    needed = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    needed = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    needed = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {0, 0};
  }
  size_t matched = 1;
  while (matched < needed && pos + matched < s.size()) {
    const auto b = static_cast<uint8_t>(s[pos + matched]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
    ++matched;
  }
  return {needed, matched};
}

}  // namespace

size_t ValidCharLength(std::string_view s, size_t pos) {
  const SequenceScan scan = Scan(s, pos);
  return scan.needed != 0 && scan.matched == scan.needed ? scan.needed : 0;
}

int DecodeAt(std::string_view s, size_t pos, size_t* length) {
  const size_t n = ValidCharLength(s, pos);
  *length = n == 0 ? 1 : n;
  if (n == 0) return -1;
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (n == 1) return b0;
  static constexpr uint8_t kLeadMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
  int cp = b0 & kLeadMask[n];
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[pos + i]) & 0x3F);
  return cp;
}

void Append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValid(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const size_t n = ValidCharLength(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string ToValid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    // Copy the longest well-formed run in one go; most text has no errors at all.
    size_t run_end = pos;
    size_t n = 0;
    while (run_end < bytes.size() && (n = ValidCharLength(bytes, run_end)) != 0) run_end += n;
    out.append(bytes.substr(pos, run_end - pos));
    pos = run_end;
    if (pos == bytes.size()) break;
    const SequenceScan scan = Scan(bytes, pos);
    out.append("\xEF\xBF\xBD");
    pos += scan.matched == 0 ? 1 : scan.matched;
  }
  return out;
}

size_t IncompleteTailLength(std::string_view bytes) {
  // A lead byte is never a continuation byte, so the last non-continuation byte within the final
  // three is where the forward scan starts its last sequence.
  for (size_t k = 1; k <= 3 && k <= bytes.size(); ++k) {
    const size_t pos = bytes.size() - k;
    const auto b = static_cast<uint8_t>(bytes[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;
    const SequenceScan scan = Scan(bytes, pos);
    return scan.needed > k && scan.matched == k ? k : 0;
  }
  return 0;
}

bool IsWhitespace(int cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

size_t TrailingWhitespaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    // Step back to the start of the previous character (at most 3 continuation bytes).
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    size_t length = 0;
    const int cp = DecodeAt(s, start, &length);
    if (start + length != end || !IsWhitespace(cp)) break;
    end = start;
  }
  return end;
}

size_t LeadingWhitespaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t length = 0;
    const int cp = DecodeAt(s, pos, &length);
    if (!IsWhitespace(cp)) break;
    pos += length;
  }
  return pos;
}

}  // namespace specula::utf8
