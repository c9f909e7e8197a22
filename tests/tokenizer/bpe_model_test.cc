#include "common/tokenizer/bpe_model.h"

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::unique_ptr<BpeModel> Parse(const Json& config) {
  auto model = BpeModel::FromJson(config, "model");
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

std::vector<int32_t> Encode(const BpeModel& model, std::string_view word) {
  std::vector<int32_t> ids;
  model.Encode(word, &ids);
  return ids;
}

TEST(BpeModelTest, MergesByRankThenLeftmost) {
  auto model = Parse({{"vocab", {{"a", 0}, {"b", 1}, {"aa", 2}, {"ab", 3}, {"aab", 4}}},
                      {"merges", {"a b", "a a", "a ab"}}});
  ASSERT_NE(model, nullptr);
  // "a b" (rank 0) beats "a a" (rank 1): a a b -> a ab -> aab.
  EXPECT_THAT(Encode(*model, "aab"), ElementsAre(4));
  // Equal ranks: leftmost first, so "aaa" is "aa a".
  EXPECT_THAT(Encode(*model, "aaa"), ElementsAre(2, 0));
  EXPECT_THAT(Encode(*model, "aaaa"), ElementsAre(2, 2));
  // Cached words give the same answer.
  EXPECT_THAT(Encode(*model, "aaa"), ElementsAre(2, 0));
  EXPECT_EQ(model->vocab_size(), 5);
  EXPECT_EQ(*model->IdToToken(4), "aab");
  EXPECT_EQ(model->IdToToken(5), nullptr);
  EXPECT_EQ(model->TokenToId("ab"), 3);
}

TEST(BpeModelTest, UnknownCharacters) {
  Json config = {{"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}}},
                 {"merges", {"a b"}},
                 {"unk_token", "<unk>"}};
  auto plain = Parse(config);
  ASSERT_NE(plain, nullptr);
  EXPECT_THAT(Encode(*plain, "axyb"), ElementsAre(1, 0, 0, 2));
  config["fuse_unk"] = true;
  auto fused = Parse(config);
  ASSERT_NE(fused, nullptr);
  EXPECT_THAT(Encode(*fused, "axyb"), ElementsAre(1, 0, 2));
  EXPECT_THAT(Encode(*fused, "abxab"), ElementsAre(3, 0, 3));
  // Without an unk token the character is dropped, as Hugging Face does.
  config.erase("unk_token");
  auto dropping = Parse(config);
  ASSERT_NE(dropping, nullptr);
  EXPECT_THAT(Encode(*dropping,
                     "a\xC3\xA9"
                     "b"),
              ElementsAre(3));
}

TEST(BpeModelTest, ByteFallbackNeedsEveryByte) {
  auto model =
      Parse({{"vocab", {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}, {"<0xE2>", 4}}},
             {"merges", Json::array()},
             {"unk_token", "<unk>"},
             {"byte_fallback", true}});
  ASSERT_NE(model, nullptr);
  EXPECT_THAT(Encode(*model, "a\xC3\xA9"), ElementsAre(1, 2, 3));
  // "€" is E2 82 AC and <0x82> is missing: the whole character becomes <unk>.
  EXPECT_THAT(Encode(*model,
                     "\xE2\x82\xAC"
                     "a"),
              ElementsAre(0, 1));
}

TEST(BpeModelTest, SubwordPrefixAndSuffix) {
  auto prefixed = Parse({{"vocab", {{"a", 0}, {"##b", 1}, {"##c", 2}, {"ab", 3}}},
                         {"merges", {"a ##b"}},
                         {"continuing_subword_prefix", "##"}});
  ASSERT_NE(prefixed, nullptr);
  EXPECT_THAT(Encode(*prefixed, "abc"), ElementsAre(3, 2));
  auto suffixed = Parse({{"vocab", {{"a", 0}, {"b</w>", 1}, {"ab</w>", 2}}},
                         {"merges", {"a b</w>"}},
                         {"end_of_word_suffix", "</w>"}});
  ASSERT_NE(suffixed, nullptr);
  EXPECT_THAT(Encode(*suffixed, "ab"), ElementsAre(2));
}

TEST(BpeModelTest, ConcurrentEncodeAgrees) {
  auto model = Parse({{"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}});
  ASSERT_NE(model, nullptr);
  std::vector<std::thread> threads;
  std::vector<bool> ok(4, true);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const std::string word = std::string(i % 7 + 1, 'a') + "b";
        std::vector<int32_t> expected(i % 7, 0);
        expected.push_back(2);
        if (Encode(*model, word) != expected) ok[t] = false;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ok, std::vector<bool>(4, true));
}

TEST(BpeModelTest, Errors) {
  const Json vocab = {{"a", 0}, {"b", 1}, {"ab", 2}};
  EXPECT_EQ(
      BpeModel::FromJson(Json{{"vocab", vocab}, {"merges", {"a b c"}}}, "model").status().message(),
      "model.merges[0] 'a b c' must be two tokens separated by one space");
  EXPECT_THAT(
      BpeModel::FromJson(Json{{"vocab", vocab}, {"merges", {5}}}, "model").status().message(),
      HasSubstr("model.merges[0] must be a \"left right\" string or a [left, right] pair"));
  EXPECT_THAT(BpeModel::FromJson(Json{{"vocab", {{"a", -1}}}, {"merges", Json::array()}}, "model")
                  .status()
                  .message(),
              HasSubstr("model.vocab['a'] must be an integer id"));
  EXPECT_EQ(BpeModel::FromJson(Json{{"vocab", vocab}, {"unk_token", "<unk>"}}, "model")
                .status()
                .message(),
            "model.unk_token '<unk>' is not in model.vocab");
  const auto dropout = BpeModel::FromJson(Json{{"vocab", vocab}, {"dropout", 0.1}}, "model");
  EXPECT_EQ(dropout.status().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(BpeModel::FromJson(Json{{"merges", Json::array()}}, "model").status().message(),
              HasSubstr("model.vocab is missing"));
}

}  // namespace
}  // namespace specula
