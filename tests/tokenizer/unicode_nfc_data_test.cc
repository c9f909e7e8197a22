#include "common/tokenizer/unicode_nfc_data.h"

#include <gtest/gtest.h>

namespace specula::unicode_nfc_data {
namespace {

// The look-ups binary-search these tables.
TEST(UnicodeNfcDataTest, TablesAreSorted) {
  for (size_t i = 0; i < kCombiningClassCount; ++i) {
    EXPECT_LE(kCombiningClasses[i].first, kCombiningClasses[i].last);
    EXPECT_GT(kCombiningClasses[i].ccc, 0);
    if (i > 0) {
      EXPECT_LT(kCombiningClasses[i - 1].last, kCombiningClasses[i].first);
    }
  }
  for (size_t i = 1; i < kDecompositionCount; ++i) {
    EXPECT_LT(kDecompositions[i - 1].code_point, kDecompositions[i].code_point);
  }
  for (size_t i = 1; i < kCompositionCount; ++i) {
    const Composition& a = kCompositions[i - 1];
    const Composition& b = kCompositions[i];
    EXPECT_TRUE(a.first < b.first || (a.first == b.first && a.second < b.second));
  }
}

TEST(UnicodeNfcDataTest, KnownEntries) {
  // U+0301 COMBINING ACUTE ACCENT has class 230; "e" + U+0301 composes to U+00E9.
  bool found_acute = false;
  for (size_t i = 0; i < kCombiningClassCount; ++i) {
    if (kCombiningClasses[i].first <= 0x301 && 0x301 <= kCombiningClasses[i].last) {
      found_acute = kCombiningClasses[i].ccc == 230;
    }
  }
  EXPECT_TRUE(found_acute);
  bool found_e_acute = false;
  for (size_t i = 0; i < kCompositionCount; ++i) {
    if (kCompositions[i].first == 'e' && kCompositions[i].second == 0x301) {
      found_e_acute = kCompositions[i].composite == 0xE9;
    }
  }
  EXPECT_TRUE(found_e_acute);
}

}  // namespace
}  // namespace specula::unicode_nfc_data
