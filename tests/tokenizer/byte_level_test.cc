#include "common/tokenizer/byte_level.h"

#include <set>

#include <gtest/gtest.h>

namespace specula::byte_level {
namespace {

TEST(ByteLevelTest, AlphabetIsABijection) {
  std::set<std::string_view> chars;
  for (int b = 0; b < 256; ++b) {
    const std::string_view ch = ByteToChar(static_cast<uint8_t>(b));
    chars.insert(ch);
    std::string back;
    ASSERT_TRUE(Decode(ch, &back));
    EXPECT_EQ(back, std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(chars.size(), 256u);
}

TEST(ByteLevelTest, KnownGpt2Characters) {
  EXPECT_EQ(ByteToChar(' '), "\u0120");   // Ġ
  EXPECT_EQ(ByteToChar('\n'), "\u010A");  // Ċ
  EXPECT_EQ(ByteToChar(0), "\u0100");
  EXPECT_EQ(ByteToChar(0xAD), "\u0143");  // soft hyphen -> Ń
  EXPECT_EQ(ByteToChar('a'), "a");
  EXPECT_EQ(ByteToChar(0xE9), "\u00E9");
  EXPECT_EQ(CharToByte(0x120), ' ');
  EXPECT_EQ(CharToByte(' '), -1);
  EXPECT_EQ(CharToByte(0x4E00), -1);
}

TEST(ByteLevelTest, EncodeDecode) {
  EXPECT_EQ(Encode(" hi\n"), "\u0120hi\u010A");
  EXPECT_EQ(Encode("\xC3\xA9"), "\u00C3\u00A9");
  std::string out = "x";
  EXPECT_TRUE(Decode("\u0120hello", &out));
  EXPECT_EQ(out, "x hello");
  // A space is not an alphabet character: nothing is appended.
  EXPECT_FALSE(Decode("<|im start|>", &out));
  EXPECT_EQ(out, "x hello");
}

}  // namespace
}  // namespace specula::byte_level
