#include "common/tokenizer/added_vocabulary.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Renders segments as "text" or "#id".
std::vector<std::string> Split(const AddedVocabulary& vocab, std::string_view text,
                               bool normalized = false) {
  std::vector<AddedVocabulary::Segment> segments;
  vocab.Split(text, normalized, &segments);
  std::vector<std::string> out;
  for (const auto& s : segments) {
    out.push_back(s.id >= 0 ? StrCat("#", s.id)
                            : std::string(text.substr(s.begin, s.end - s.begin)));
  }
  return out;
}

TEST(AddedVocabularyTest, LeftmostLongest) {
  const AddedVocabulary vocab({{.id = 10, .content = "<a>"}, {.id = 11, .content = "<a><b>"}});
  EXPECT_THAT(Split(vocab, "x<a><b>y<a>"), ElementsAre("x", "#11", "y", "#10"));
  EXPECT_THAT(Split(vocab, "<a><a>"), ElementsAre("#10", "#10"));
  EXPECT_THAT(Split(vocab, "plain"), ElementsAre("plain"));
  EXPECT_THAT(Split(vocab, ""), ElementsAre());
}

TEST(AddedVocabularyTest, SingleWordAndStripping) {
  const AddedVocabulary vocab({{.id = 1, .content = "hi", .single_word = true},
                               {.id = 2, .content = "<r>", .rstrip = true},
                               {.id = 3, .content = "<l>", .lstrip = true}});
  EXPECT_THAT(Split(vocab, "hi there"), ElementsAre("#1", " there"));
  EXPECT_THAT(Split(vocab, "this"), ElementsAre("this"));
  EXPECT_THAT(Split(vocab, "a <r>  b"), ElementsAre("a ", "#2", "b"));
  EXPECT_THAT(Split(vocab, "a  <l> b"), ElementsAre("a", "#3", " b"));
}

TEST(AddedVocabularyTest, NormalizedTokensMatchSeparately) {
  const AddedVocabulary vocab(
      {{.id = 5, .content = "raw"}, {.id = 6, .content = "norm", .normalized = true}});
  EXPECT_THAT(Split(vocab, "raw norm"), ElementsAre("#5", " norm"));
  EXPECT_THAT(Split(vocab, "raw norm", /*normalized=*/true), ElementsAre("raw ", "#6"));
}

TEST(AddedVocabularyTest, FromJson) {
  const auto json = nlohmann::json::parse(R"([
      {"id": 7, "content": "<|eot|>", "single_word": false, "lstrip": false, "rstrip": false,
       "normalized": false, "special": true},
      {"id": 8, "content": "<tool>"}])");
  auto vocab = AddedVocabulary::FromJson(json, "added_tokens");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->FindByContent("<|eot|>")->id, 7);
  EXPECT_TRUE(vocab->FindById(7)->special);
  // "normalized" defaults to !special, as in Hugging Face.
  EXPECT_TRUE(vocab->FindById(8)->normalized);
  EXPECT_EQ(vocab->FindById(9), nullptr);
  EXPECT_THAT(AddedVocabulary::FromJson(nlohmann::json::parse(R"([{"id": 1, "content": ""}])"),
                                        "added_tokens")
                  .status()
                  .message(),
              HasSubstr("added_tokens[0].content must not be empty"));
  EXPECT_THAT(
      AddedVocabulary::FromJson(nlohmann::json::parse(R"([{"content": "x"}])"), "added_tokens")
          .status()
          .message(),
      HasSubstr("added_tokens[0].id is missing"));
}

}  // namespace
}  // namespace specula
