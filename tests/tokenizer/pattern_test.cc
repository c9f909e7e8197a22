#include "common/tokenizer/pattern.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(PatternTest, LiteralAndRegex) {
  auto literal = Pattern::FromJson(nlohmann::json{{"String", "\u2581"}}, "p");
  ASSERT_TRUE(literal.ok()) << literal.status();
  std::vector<std::pair<size_t, size_t>> matches;
  literal->FindAll("\u2581a\u2581\u2581", &matches);
  EXPECT_THAT(matches, ElementsAre(Pair(0, 3), Pair(4, 7), Pair(7, 10)));
  EXPECT_EQ(literal->ReplaceAll("\u2581a\u2581", " "), " a ");

  auto regex = Pattern::FromJson(nlohmann::json{{"Regex", " +"}}, "p");
  ASSERT_TRUE(regex.ok()) << regex.status();
  EXPECT_EQ(regex->ReplaceAll("a  b c", "_"), "a_b_c");
  EXPECT_EQ(Pattern::Literal("").ReplaceAll("abc", "x"), "abc");
}

TEST(PatternTest, Errors) {
  EXPECT_THAT(
      Pattern::FromJson(nlohmann::json{{"Glob", "*"}}, "decoder.pattern").status().message(),
      HasSubstr("decoder.pattern has key 'Glob'"));
  EXPECT_THAT(Pattern::FromJson(nlohmann::json("x"), "p").status().message(),
              HasSubstr("p must be an object with one key"));
  EXPECT_THAT(Pattern::FromJson(nlohmann::json{{"Regex", "("}}, "p").status().message(),
              HasSubstr("p.Regex: regex '('"));
}

}  // namespace
}  // namespace specula
