#include "common/tokenizer/pre_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::vector<std::string> PreTokenize(const Json& config, std::string_view text,
                                     bool at_start = true) {
  auto pre_tokenizer = ParsePreTokenizer(config, "pre_tokenizer");
  EXPECT_TRUE(pre_tokenizer.ok()) << pre_tokenizer.status();
  if (!pre_tokenizer.ok()) return {};
  std::vector<PreToken> tokens = {{std::string(text), at_start}};
  (*pre_tokenizer)->PreTokenize(&tokens);
  std::vector<std::string> out;
  for (const PreToken& token : tokens) out.push_back(token.text);
  return out;
}

Json SplitConfig(std::string_view regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}};
}

TEST(PreTokenizerTest, Gpt2ByteLevel) {
  const Json config = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_THAT(PreTokenize(config, "Hello world's  test 123"),
              ElementsAre("Hello", "\u0120world", "'s", "\u0120", "\u0120test", "\u0120123"));
  const Json prefixed = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}};
  EXPECT_THAT(PreTokenize(prefixed, "hi\n"), ElementsAre("\u0120hi\u010A"));
}

TEST(PreTokenizerTest, Llama3SplitOnCode) {
  EXPECT_THAT(
      PreTokenize(SplitConfig(kLlama3SplitPattern), "def _foo(x):\n    return x.bar + 12345"),
      ElementsAre("def", " _", "foo", "(x", "):\n", "   ", " return", " x", ".bar", " +", " ",
                  "123", "45"));
  EXPECT_THAT(PreTokenize(SplitConfig(kLlama3SplitPattern), "I'M here\n\n\nok"),
              ElementsAre("I", "'M", " here", "\n\n\n", "ok"));
}

TEST(PreTokenizerTest, SplitBehaviors) {
  // Parts of "a-b--c": a | - | b | - | - | c.
  const std::vector<std::pair<size_t, size_t>> matches = {{1, 2}, {3, 4}, {4, 5}};
  const auto split = [&](SplitBehavior behavior, bool invert) {
    const std::string text = "a-b--c";
    std::vector<std::pair<size_t, size_t>> pieces;
    SplitByMatches(text.size(), matches, behavior, invert, &pieces);
    std::vector<std::string> out;
    for (const auto& [begin, end] : pieces) out.push_back(text.substr(begin, end - begin));
    return out;
  };
  EXPECT_THAT(split(SplitBehavior::kRemoved, false), ElementsAre("a", "b", "c"));
  EXPECT_THAT(split(SplitBehavior::kIsolated, false), ElementsAre("a", "-", "b", "-", "-", "c"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithPrevious, false), ElementsAre("a-", "b-", "-", "c"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithNext, false), ElementsAre("a", "-b", "-", "-c"));
  EXPECT_THAT(split(SplitBehavior::kContiguous, false), ElementsAre("a", "-", "b", "--", "c"));
  EXPECT_THAT(split(SplitBehavior::kRemoved, true), ElementsAre("-", "-", "-"));
}

TEST(PreTokenizerTest, Metaspace) {
  const Json config = {{"type", "Metaspace"},
                       {"replacement", "\u2581"},
                       {"prepend_scheme", "first"},
                       {"split", true}};
  EXPECT_THAT(PreTokenize(config, "Hello  world"),
              ElementsAre("\u2581Hello", "\u2581", "\u2581world"));
  // "first" prepends only at the start of the encoded text.
  EXPECT_THAT(PreTokenize(config, "world", /*at_start=*/false), ElementsAre("world"));
  Json always = config;
  always["prepend_scheme"] = "always";
  always["split"] = false;
  EXPECT_THAT(PreTokenize(always, "a b", false), ElementsAre("\u2581a\u2581b"));
  // Legacy files say add_prefix_space instead of prepend_scheme.
  const Json legacy = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", false}};
  EXPECT_THAT(PreTokenize(legacy, "a b"), ElementsAre("a", "\u2581b"));
}

TEST(PreTokenizerTest, SequenceAndDigits) {
  const Json config = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_THAT(PreTokenize(config, "x 42"), ElementsAre("x\u0120", "4", "2"));
}

TEST(PreTokenizerTest, Errors) {
  auto result = ParsePreTokenizer(Json{{"type", "BertPreTokenizer"}}, "pre_tokenizer");
  EXPECT_EQ(result.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(result.status().message(), "pre_tokenizer.type 'BertPreTokenizer' is not supported");
  Json bad = SplitConfig("x");
  bad["behavior"] = "Sideways";
  EXPECT_THAT(ParsePreTokenizer(bad, "pre_tokenizer").status().message(),
              HasSubstr("pre_tokenizer.behavior 'Sideways' is not one of"));
  const Json nested = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Punctuation"}}}}};
  EXPECT_EQ(ParsePreTokenizer(nested, "pre_tokenizer").status().message(),
            "pre_tokenizer.pretokenizers[0].type 'Punctuation' is not supported");
  auto none = ParsePreTokenizer(Json(), "pre_tokenizer");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

}  // namespace
}  // namespace specula
