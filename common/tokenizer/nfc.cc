#include "common/tokenizer/nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/tokenizer/unicode_nfc_data.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

namespace data = unicode_nfc_data;

// Hangul syllables are <L, V> or <L, V, T> jamo sequences; composition is arithmetic.
constexpr int32_t kSBase = 0xAC00;
constexpr int32_t kLBase = 0x1100;
constexpr int32_t kVBase = 0x1161;
constexpr int32_t kTBase = 0x11A7;
constexpr int32_t kLCount = 19;
constexpr int32_t kVCount = 21;
constexpr int32_t kTCount = 28;
constexpr int32_t kNCount = kVCount * kTCount;
constexpr int32_t kSCount = kLCount * kNCount;

// Ill-formed bytes are carried as negative values: starters that match no table entry.
int32_t ByteMarker(uint8_t byte) { return -1 - static_cast<int32_t>(byte); }

int CombiningClass(int32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = data::kCombiningClasses + data::kCombiningClassCount;
  const auto* it = std::upper_bound(
      data::kCombiningClasses, end, static_cast<char32_t>(cp),
      [](char32_t value, const data::CombiningClassRange& range) { return value < range.first; });
  if (it == data::kCombiningClasses) return 0;
  --it;
  return static_cast<char32_t>(cp) <= it->last ? it->ccc : 0;
}

void Decompose(int32_t cp, std::vector<int32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int32_t s = cp - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const auto* end = data::kDecompositions + data::kDecompositionCount;
    const auto* it = std::lower_bound(
        data::kDecompositions, end, static_cast<char32_t>(cp),
        [](const data::Decomposition& d, char32_t value) { return d.code_point < value; });
    if (it != end && it->code_point == static_cast<char32_t>(cp)) {
      Decompose(static_cast<int32_t>(it->first), out);
      if (it->second != 0) Decompose(static_cast<int32_t>(it->second), out);
      return;
    }
  }
  out->push_back(cp);
}

// The primary composite of `first` + `second`, or -1.
int32_t Compose(int32_t first, int32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  if (first < 0 || second < 0) return -1;
  const auto* end = data::kCompositions + data::kCompositionCount;
  const data::Composition key = {static_cast<char32_t>(first), static_cast<char32_t>(second), 0};
  const auto* it = std::lower_bound(
      data::kCompositions, end, key, [](const data::Composition& a, const data::Composition& b) {
        return a.first != b.first ? a.first < b.first : a.second < b.second;
      });
  if (it == end || it->first != key.first || it->second != key.second) return -1;
  return static_cast<int32_t>(it->composite);
}

}  // namespace

std::string ToNfc(std::string_view text) {
  // Lead bytes from 0xCC up start code points >= U+0300 (or are ill-formed); below that every
  // character is a starter with no decomposition.
  if (std::none_of(text.begin(), text.end(),
                   [](char c) { return static_cast<uint8_t>(c) >= 0xCC; })) {
    return std::string(text);
  }

  std::vector<int32_t> chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t length = 0;
    const int cp = utf8::DecodeAt(text, pos, &length);
    if (cp < 0) {
      chars.push_back(ByteMarker(static_cast<uint8_t>(text[pos])));
    } else {
      Decompose(cp, &chars);
    }
    pos += length;
  }

  // Canonical ordering: a stable sort of every run of non-starters by combining class.
  for (size_t i = 1; i < chars.size(); ++i) {
    const int ccc = CombiningClass(chars[i]);
    if (ccc == 0) continue;
    for (size_t j = i; j > 0 && CombiningClass(chars[j - 1]) > ccc; --j) {
      std::swap(chars[j - 1], chars[j]);
    }
  }

  // Canonical composition: a character combines with the last starter unless a character of the
  // same or higher class (or another starter) stands between them.
  size_t out = 0;
  int64_t starter = -1;
  int last_class = 0;
  for (const int32_t cp : chars) {
    const int ccc = CombiningClass(cp);
    if (starter >= 0 && (last_class < ccc || last_class == 0)) {
      const int32_t composite = Compose(chars[starter], cp);
      if (composite >= 0) {
        chars[starter] = composite;
        continue;
      }
    }
    if (ccc == 0) starter = static_cast<int64_t>(out);
    last_class = ccc;
    chars[out++] = cp;
  }

  std::string result;
  result.reserve(text.size());
  for (size_t i = 0; i < out; ++i) {
    if (chars[i] < 0) {
      result.push_back(static_cast<char>(-1 - chars[i]));
    } else {
      utf8::Append(static_cast<char32_t>(chars[i]), &result);
    }
  }
  return result;
}

}  // namespace specula
