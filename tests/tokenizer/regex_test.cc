#include "common/tokenizer/regex.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::vector<std::pair<size_t, size_t>> FindAll(std::string_view pattern, std::string_view text) {
  auto regex = Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status();
  std::vector<std::pair<size_t, size_t>> matches;
  if (regex.ok()) regex->FindAll(text, &matches);
  return matches;
}

TEST(RegexTest, UnicodeClasses) {
  // \p{L} and \s are Unicode-aware (UCP): "é" is a letter, U+3000 a space.
  EXPECT_THAT(FindAll(R"(\p{L}+)", "caf\xC3\xA9 x"), ElementsAre(Pair(0, 5), Pair(6, 7)));
  EXPECT_THAT(FindAll(R"(\s+)",
                      "a\xE3\x80\x80"
                      "b"),
              ElementsAre(Pair(1, 4)));
}

TEST(RegexTest, SkipsEmptyMatchesAndInvalidBytes) {
  EXPECT_THAT(FindAll("x*", "axxb\xC3\xA9x"), ElementsAre(Pair(1, 3), Pair(6, 7)));
  // Ill-formed bytes never match but do not stop the search.
  EXPECT_THAT(FindAll(R"(\p{L}+)",
                      "ab\xFF\xC3"
                      "cd"),
              ElementsAre(Pair(0, 2), Pair(4, 6)));
}

TEST(RegexTest, LookaheadAndLongRuns) {
  // GPT-2's "\s+(?!\S)" leaves the last space for the following word.
  EXPECT_THAT(FindAll(R"(\s+(?!\S)|\s+)", "a   b"), ElementsAre(Pair(1, 3), Pair(3, 4)));
  // A megabyte of whitespace is one match even if the JIT stack is too small for it.
  const std::string spaces(1 << 20, ' ');
  EXPECT_THAT(FindAll(R"(\s+(?!\S)|\s+)", spaces), ElementsAre(Pair(0, spaces.size())));
}

TEST(RegexTest, MatchesAndErrors) {
  auto word = Regex::Compile(R"(\A\w\z)");
  ASSERT_TRUE(word.ok());
  EXPECT_TRUE(word->Matches("\xC3\xA9"));
  EXPECT_FALSE(word->Matches("-"));
  EXPECT_EQ(word->pattern(), R"(\A\w\z)");
  auto bad = Regex::Compile("a(b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("regex 'a(b' does not compile at offset 3"));
}

}  // namespace
}  // namespace specula
