#include "common/tokenizer/nfc.h"

#include <cstdint>

#include <gtest/gtest.h>

#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

std::string Utf8(std::u32string_view code_points) {
  std::string out;
  for (char32_t cp : code_points) utf8::Append(cp, &out);
  return out;
}

uint64_t Fnv1a(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

// Expected values come from Python's unicodedata.normalize("NFC", ...), Unicode 14.0.0.
TEST(NfcTest, HandVectors) {
  EXPECT_EQ(ToNfc(Utf8(U"e\u0301")), Utf8(U"\u00E9"));
  EXPECT_EQ(ToNfc(Utf8(U"\u212B")), Utf8(U"\u00C5"));              // singleton decomposition
  EXPECT_EQ(ToNfc(Utf8(U"\u1100\u1161\u11A8")), Utf8(U"\uAC01"));  // Hangul LVT
  EXPECT_EQ(ToNfc(Utf8(U"a\u0323\u0302")), Utf8(U"\u1EAD"));
  EXPECT_EQ(ToNfc(Utf8(U"a\u0302\u0323")), Utf8(U"\u1EAD"));  // reordered before composing
  EXPECT_EQ(ToNfc(Utf8(U"\u0344")), Utf8(U"\u0308\u0301"));   // excluded from composition
  EXPECT_EQ(ToNfc(Utf8(U"A\u0308\u0304")), Utf8(U"\u01DE"));
  EXPECT_EQ(ToNfc(Utf8(U"\u1E0A\u0323")), Utf8(U"\u1E0C\u0307"));
  EXPECT_EQ(ToNfc(Utf8(U"q\u0307\u0323")), Utf8(U"q\u0323\u0307"));
  EXPECT_EQ(ToNfc(Utf8(U"\u0B47\u0B3E")), Utf8(U"\u0B4B"));  // two starters compose
  EXPECT_EQ(ToNfc(Utf8(U"\u304B\u3099")), Utf8(U"\u304C"));
}

TEST(NfcTest, PassesThroughAsciiAndIllFormedBytes) {
  EXPECT_EQ(ToNfc("def f(x):\n    return x\n"), "def f(x):\n    return x\n");
  // An ill-formed byte separates "e" from its accent, so they do not compose.
  EXPECT_EQ(ToNfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_EQ(ToNfc("\xE2\x82 e\xCC\x81"), "\xE2\x82 \xC3\xA9");
}

TEST(NfcTest, EveryCodePointMatchesPython) {
  // NFC of "c\n" for every scalar value c; the newlines keep characters from interacting.
  std::string text;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    utf8::Append(cp, &text);
    text.push_back('\n');
  }
  const std::string nfc = ToNfc(text);
  EXPECT_EQ(nfc.size(), 5494438u);
  EXPECT_EQ(Fnv1a(nfc), 0x3ce40516aab8cae9ull);
}

TEST(NfcTest, RandomMarkSequencesMatchPython) {
  // Bases, jamo, combining marks of several classes and excluded characters in a pseudo-random
  // order; the generator and alphabet are mirrored in the Python that produced the hash.
  const char32_t alphabet[] = {0x41,   0x61,   0x45,   0x65,   0x4F,   0x6F,   0x55,   0x1100,
                               0x1161, 0x11A8, 0xAC00, 0x0300, 0x0301, 0x0302, 0x0308, 0x0323,
                               0x0327, 0x031B, 0x0344, 0x0340, 0x212B, 0x0F73, 0x0CC6, 0x0CC2,
                               0x0CD5, 0x0B47, 0x0B3E, 0x3099, 0x304B, 0x05B0, 0x05B4, 0x0591,
                               0xFF9E, 0x1E0A, 0x0307, 0x20};
  const uint64_t alphabet_size = sizeof(alphabet) / sizeof(alphabet[0]);
  uint64_t x = 42;
  std::u32string code_points;
  for (int i = 0; i < 20000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    code_points.push_back(alphabet[(x >> 33) % alphabet_size]);
  }
  const std::string nfc = ToNfc(Utf8(code_points));
  EXPECT_EQ(nfc.size(), 44460u);
  EXPECT_EQ(Fnv1a(nfc), 0x2d325d9341999310ull);
}

}  // namespace
}  // namespace specula
