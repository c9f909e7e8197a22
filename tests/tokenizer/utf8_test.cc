#include "common/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include "common/util/status.h"

namespace specula::utf8 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

std::string Replacements(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.append(kReplacement);
  return out;
}

TEST(Utf8Test, ValidCharLength) {
  EXPECT_EQ(ValidCharLength("a", 0), 1u);
  EXPECT_EQ(ValidCharLength("\xC3\xA9", 0), 2u);
  EXPECT_EQ(ValidCharLength("\xE2\x82\xAC", 0), 3u);
  EXPECT_EQ(ValidCharLength("\xF0\x9F\x98\x80", 0), 4u);
  EXPECT_EQ(ValidCharLength("\xC0\xAF", 0), 0u);          // overlong
  EXPECT_EQ(ValidCharLength("\xED\xA0\x80", 0), 0u);      // surrogate
  EXPECT_EQ(ValidCharLength("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(ValidCharLength("\xE2\x82", 0), 0u);          // truncated
  EXPECT_EQ(CharLength("\xFF", 0), 1u);
}

TEST(Utf8Test, DecodeAndAppend) {
  size_t length = 0;
  EXPECT_EQ(DecodeAt("\xF0\x9F\x98\x80", 0, &length), 0x1F600);
  EXPECT_EQ(length, 4u);
  EXPECT_EQ(DecodeAt("\x80", 0, &length), -1);
  EXPECT_EQ(length, 1u);
  for (char32_t cp : {U'a', U'\u00E9', U'\u20AC', U'\U0001F600'}) {
    std::string encoded;
    Append(cp, &encoded);
    EXPECT_EQ(DecodeAt(encoded, 0, &length), static_cast<int>(cp));
    EXPECT_EQ(length, encoded.size());
  }
}

// Expected values are Python's bytes.decode("utf-8", errors="replace").
TEST(Utf8Test, ToValidReplacesMaximalSubparts) {
  EXPECT_EQ(ToValid("plain \xC3\xA9"), "plain \xC3\xA9");
  EXPECT_EQ(ToValid("\xF0\x80\x80"), Replacements(3));
  EXPECT_EQ(ToValid("\xE2\x82"), Replacements(1));
  EXPECT_EQ(ToValid("\xE2\x82"
                    "A"),
            StrCat(kReplacement, "A"));
  EXPECT_EQ(ToValid("\xED\xA0\x80"), Replacements(3));
  EXPECT_EQ(ToValid("\xC0\xAF"), Replacements(2));
  EXPECT_EQ(ToValid("\xF4\x90\x80\x80"), Replacements(4));
  EXPECT_EQ(ToValid("a\xFF"
                    "b"),
            StrCat("a", kReplacement, "b"));
  EXPECT_EQ(ToValid("\xF0\x9F\x98"), Replacements(1));
  EXPECT_TRUE(IsValid("\xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValid("\xF0\x9F\x98"));
}

TEST(Utf8Test, IncompleteTailLength) {
  EXPECT_EQ(IncompleteTailLength(""), 0u);
  EXPECT_EQ(IncompleteTailLength("abc"), 0u);
  EXPECT_EQ(IncompleteTailLength("abc\xE2"), 1u);
  EXPECT_EQ(IncompleteTailLength("abc\xE2\x82"), 2u);
  EXPECT_EQ(IncompleteTailLength("\xE2\x82\xAC"), 0u);
  EXPECT_EQ(IncompleteTailLength("\xF0\x9F\x98"), 3u);
  EXPECT_EQ(IncompleteTailLength("\xE2"
                                 "A"),
            0u);
  EXPECT_EQ(IncompleteTailLength("\xED\xA0"), 0u);  // a surrogate can never complete
  EXPECT_EQ(IncompleteTailLength("\xC0"), 0u);
  EXPECT_EQ(IncompleteTailLength("\x80\x80"), 0u);
}

TEST(Utf8Test, Whitespace) {
  EXPECT_TRUE(IsWhitespace(' '));
  EXPECT_TRUE(IsWhitespace('\n'));
  EXPECT_TRUE(IsWhitespace(0x3000));
  EXPECT_FALSE(IsWhitespace('a'));
  EXPECT_FALSE(IsWhitespace(-1));
  EXPECT_EQ(TrailingWhitespaceStart("ab \t\xE3\x80\x80"), 2u);
  EXPECT_EQ(TrailingWhitespaceStart("   "), 0u);
  EXPECT_EQ(TrailingWhitespaceStart("ab"), 2u);
  EXPECT_EQ(LeadingWhitespaceLength("\xE3\x80\x80 x "), 4u);
  EXPECT_EQ(LeadingWhitespaceLength("x"), 0u);
}

}  // namespace
}  // namespace specula::utf8
