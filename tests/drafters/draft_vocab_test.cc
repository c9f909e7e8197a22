// The draft vocabulary (ranking, file format, errors) and the head cut to it.
#include "common/drafters/draft_vocab.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "common/model/draft_head.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DraftVocabTest, KeepsTheMostFrequentTokensWithTheirCoverage) {
  // Token 3 most often; 1 and 4 tie (the lower id first); 0 and 5 never appear.
  const std::vector<int64_t> counts = {0, 20, 5, 50, 20, 0};
  DraftVocab v = DraftVocab::FromCounts(counts, 3, "counts");
  EXPECT_EQ(v.vocab_size, 6);
  EXPECT_THAT(v.tokens, ElementsAre(3, 1, 4));
  EXPECT_EQ(v.counted_tokens, 95);
  EXPECT_DOUBLE_EQ(v.coverage, 90.0 / 95.0);
  // Asking for more than ever appeared keeps only what appeared.
  EXPECT_THAT(DraftVocab::FromCounts(counts, 10, "counts").tokens, ElementsAre(3, 1, 4, 2));
}

TEST(DraftVocabTest, JsonRoundTrip) {
  DraftVocab v = DraftVocab::FromCounts({7, 1, 9, 0}, 2, "data/distill.bin");
  auto back = DraftVocab::FromJson(v.ToJson(), "dv.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), v.ToJson());
  EXPECT_THAT(back->tokens, ElementsAre(2, 0));
  EXPECT_EQ(back->source, "data/distill.bin");
}

TEST(DraftVocabTest, BadFilesNameTheFieldAndTheFile) {
  auto error = [](std::string_view text) {
    return DraftVocab::FromJson(text, "dv.json").status().ToString();
  };
  EXPECT_THAT(error("[1, 2]"), HasSubstr("dv.json: not a JSON object"));
  EXPECT_THAT(error(R"({"tokens": [1]})"), HasSubstr("'vocab_size'"));
  EXPECT_THAT(error(R"({"vocab_size": 8})"), HasSubstr("'tokens'"));
  EXPECT_THAT(error(R"({"vocab_size": 8, "tokens": []})"), HasSubstr("'tokens' is empty"));
  EXPECT_THAT(error(R"({"vocab_size": 8, "tokens": [1, 8]})"), HasSubstr("token 8 outside [0, 8)"));
  EXPECT_THAT(error(R"({"vocab_size": 8, "tokens": [1, 2, 1]})"),
              HasSubstr("token 1 is listed twice"));
  EXPECT_THAT(error(R"({"vocab_size": 8, "tokens": ["a"]})"), HasSubstr("must hold integers"));
  EXPECT_EQ(DraftVocab::FromFile("/nonexistent/dv.json").status().code(), StatusCode::kNotFound);
  DraftVocab v = DraftVocab::FromCounts({1, 1, 1}, 2, "");
  EXPECT_TRUE(v.CheckTarget(3, "dv").ok());
  EXPECT_THAT(v.CheckTarget(4096, "dv").message(),
              HasSubstr("made for a vocabulary of 3 tokens, the target has 4096"));
}

// The cut head computes the full head's logits on its tokens and -inf on every other one.
TEST(DraftHeadTest, RestrictedLogitsAreTheFullOnesOnTheSet) {
  torch::manual_seed(3);
  const auto weight = torch::randn({10, 6});
  DraftHead head;
  head.Set(weight);
  const auto x = torch::randn({2, 3, 6});
  torch::NoGradGuard no_grad;
  const auto full = head(x);
  EXPECT_EQ(head.size(), 10);
  const std::vector<int32_t> tokens = {7, 2, 9};
  head.Restrict(tokens);
  EXPECT_TRUE(head.restricted());
  EXPECT_EQ(head.size(), 3);
  const auto cut = head(x);
  ASSERT_EQ(cut.sizes(), full.sizes());
  for (int64_t t = 0; t < 10; ++t) {
    const bool inside = t == 7 || t == 2 || t == 9;
    const auto column = cut.select(-1, t);
    if (inside) {
      EXPECT_TRUE(torch::allclose(column, full.select(-1, t), 1e-5, 1e-5)) << t;
    } else {
      EXPECT_TRUE(torch::isinf(column).all().item<bool>()) << t;
      EXPECT_LT(column.max().item<float>(), 0);
    }
  }
  // Set again: the whole head.
  head.Set(weight);
  EXPECT_FALSE(head.restricted());
  EXPECT_TRUE(torch::allclose(head(x), full));
}

}  // namespace
}  // namespace specula
