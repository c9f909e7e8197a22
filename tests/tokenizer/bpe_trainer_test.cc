#include "common/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

BpeTrainerOptions QuietOptions(int vocab_size) {
  BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  options.show_progress = false;
  return options;
}

TEST(BpeTrainerTest, LearnsMostFrequentPairsFirst) {
  // Pre-tokens: "ab", " ab", " ab", "abc". Pair counts: (a,b)=4, (Ġ,a)=2, (b,c)=1. After "a b":
  // (Ġ,ab)=2, (ab,c)=1. Then nothing reaches min_frequency 2.
  const auto json = TrainByteLevelBpe({"ab ab ab", "abc"}, QuietOptions(300));
  ASSERT_TRUE(json.ok()) << json.status();
  const auto config = nlohmann::json::parse(*json);
  EXPECT_EQ(config["model"]["merges"], nlohmann::json({"a b", "\u0120 ab"}));
  EXPECT_EQ(config["model"]["vocab"].size(), 1u + 256u + 2u);
  EXPECT_EQ(config["model"]["vocab"]["<|endoftext|>"], 0);
  EXPECT_EQ(config["model"]["vocab"]["a"], 1 + 'a');
  EXPECT_EQ(config["model"]["vocab"]["\u0120"], 1 + ' ');
  EXPECT_EQ(config["model"]["vocab"]["ab"], 257);
  EXPECT_EQ(config["model"]["vocab"]["\u0120ab"], 258);
  EXPECT_EQ(config["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(config["added_tokens"][0]["special"], true);

  auto tok = Tokenizer::FromJson(*json, "trained");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("ab ab<|endoftext|>abc"), ElementsAre(257, 258, 0, 257, 1 + 'c'));
  EXPECT_EQ(*(*tok)->Decode({257, 258, 0, 257, 1 + 'c'}), "ab ab<|endoftext|>abc");
}

TEST(BpeTrainerTest, TiesBreakTowardsSmallerIds) {
  // "ab" and "cd" occur equally often; (a,b) has the smaller ids and is learned first.
  const auto json = TrainByteLevelBpe({"cd", "ab", "cd", "ab"}, QuietOptions(257 + 1));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(nlohmann::json::parse(*json)["model"]["merges"], nlohmann::json({"a b"}));
}

TEST(BpeTrainerTest, OverlappingPairsAreCountedPerMerge) {
  // "aaaa" merges to "aa aa" and then "aaaa"; counts must stay consistent through both.
  const auto json = TrainByteLevelBpe({"aaaa aaaa aaaa", "aaa"}, QuietOptions(300));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(nlohmann::json::parse(*json)["model"]["merges"],
            nlohmann::json({"a a", "aa aa", "\u0120 aaaa"}));
}

TEST(BpeTrainerTest, SpecialTokensAreNotLearnedFrom) {
  BpeTrainerOptions options = QuietOptions(400);
  options.special_tokens = {"<|endoftext|>", "<pad>"};
  const auto json =
      TrainByteLevelBpe({"<pad><pad><pad><pad>", "x<|endoftext|>x<|endoftext|>"}, options);
  ASSERT_TRUE(json.ok()) << json.status();
  const auto config = nlohmann::json::parse(*json);
  EXPECT_EQ(config["model"]["merges"], nlohmann::json::array());
  EXPECT_EQ(config["model"]["vocab"]["<pad>"], 1);
  EXPECT_EQ(config["added_tokens"][1]["id"], 1);
}

TEST(BpeTrainerTest, RejectsBadOptions) {
  BpeTrainerOptions options = QuietOptions(200);
  auto result = TrainByteLevelBpe({"x"}, options);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("vocab_size 200"));

  options = QuietOptions(300);
  options.pattern = "([a-z]";
  result = TrainByteLevelBpe({"x"}, options);
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("pattern: regex '([a-z]'"));

  options = QuietOptions(300);
  options.special_tokens = {"<a>", "<a>"};
  EXPECT_THAT(TrainByteLevelBpe({"x"}, options).status().message(), HasSubstr("listed twice"));
}

// Every 10th Python source of the standard library (sorted, test/ excluded), as the bundled
// model's corpus is built.
std::vector<std::string> SampleStdlibSources() {
  const std::filesystem::path root = "/usr/lib/python3.11";
  std::vector<std::filesystem::path> paths;
  for (auto it = std::filesystem::recursive_directory_iterator(root);
       it != std::filesystem::recursive_directory_iterator(); ++it) {
    if (it->is_directory() && it->path() == root / "test") {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() && it->path().extension() == ".py") paths.push_back(it->path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> sources;
  for (size_t i = 0; i < paths.size(); i += 10) {
    std::ifstream in(paths[i], std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    sources.push_back(text.str());
  }
  return sources;
}

TEST(BpeTrainerTest, StdlibRoundTrip) {
  const std::vector<std::string> sources = SampleStdlibSources();
  ASSERT_GT(sources.size(), 30u) << "Python 3.11 standard library sources not found";
  size_t total_bytes = 0;
  for (const std::string& source : sources) total_bytes += source.size();

  // Train on every other sampled file, then check every sampled file, seen or not.
  std::vector<std::string> training;
  for (size_t i = 0; i < sources.size(); i += 2) training.push_back(sources[i]);
  const auto start = std::chrono::steady_clock::now();
  const auto json = TrainByteLevelBpe(training, QuietOptions(1000));
  ASSERT_TRUE(json.ok()) << json.status();
  const auto trained = std::chrono::steady_clock::now();
  auto tok = Tokenizer::FromJson(*json, "trained");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 1000);

  size_t total_tokens = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::vector<int32_t> ids = (*tok)->Encode(sources[i]);
    total_tokens += ids.size();
    const auto decoded = (*tok)->Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ASSERT_EQ(*decoded, sources[i]) << "sampled file " << i << " does not round-trip";
  }
  const auto done = std::chrono::steady_clock::now();
  // With 1000 tokens Python source compresses to well under half a token per byte.
  EXPECT_LT(static_cast<double>(total_tokens) / total_bytes, 0.45);
  std::cout << sources.size() << " files, " << total_bytes << " bytes, " << total_tokens
            << " tokens; train " << std::chrono::duration<double>(trained - start).count()
            << " s, encode+decode " << std::chrono::duration<double>(done - trained).count()
            << " s\n";
}

TEST(BpeTrainerTest, Deterministic) {
  const std::vector<std::string> docs = {"def f(x):\n    return x + 1\n", "class A:\n    pass\n",
                                         "def g(y):\n    return y * 2\n"};
  const auto first = TrainByteLevelBpe(docs, QuietOptions(300));
  const auto second = TrainByteLevelBpe(docs, QuietOptions(300));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
}

}  // namespace
}  // namespace specula
