// common/spec/drafter.h: the input checks every drafter's Observe and Propose start with, and the
// messages they give (each names the sequence and the field).
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <utility>

#include "common/spec/drafter.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 64;
constexpr int64_t kHidden = 32;

bool Holds(SeqId seq) { return seq == 1 || seq == 2; }

TEST(DrafterChecksTest, TokenObservations) {
  EXPECT_TRUE(
      CheckTokenObservations({{.seq = 1, .tokens = {0, 63}}, {.seq = 2}}, kVocab, Holds).ok());
  Status s = CheckTokenObservations({{.seq = 7, .tokens = {1}}}, kVocab, Holds);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("sequence 7 was not added"));
  s = CheckTokenObservations({{.seq = 1, .tokens = {4, 64}}}, kVocab, Holds);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tokens[1] = 64 is outside the vocabulary [0, 64)"));
  s = CheckTokenObservations({{.seq = 1, .tokens = {-1}}}, kVocab, Holds);
  EXPECT_THAT(s.message(), HasSubstr("tokens[0] = -1"));
  s = CheckTokenObservations({{.seq = 1}, {.seq = 1}}, kVocab, Holds);
  EXPECT_THAT(s.message(), HasSubstr("observed twice"));
  // vocab 0: tokens unchecked.
  EXPECT_TRUE(CheckTokenObservations({{.seq = 1, .tokens = {1000}}}, 0, Holds).ok());
}

TEST(DrafterChecksTest, DraftRequests) {
  EXPECT_TRUE(CheckDraftRequests({{.seq = 1}, {.seq = 2}}, Holds).ok());
  EXPECT_EQ(CheckDraftRequests({{.seq = 9}}, Holds).code(), StatusCode::kNotFound);
  Status s = CheckDraftRequests({{.seq = 1}, {.seq = 1}}, Holds);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("requested twice"));
}

// Sequence 1 has seen 4 tokens and 3 hidden rows (the pending token has none); 2 is new.
std::optional<std::pair<int64_t, int64_t>> Seen(SeqId seq) {
  if (seq == 1) return std::make_pair<int64_t, int64_t>(3, 4);
  if (seq == 2) return std::make_pair<int64_t, int64_t>(0, 0);
  return std::nullopt;
}

TEST(DrafterChecksTest, HiddenObservations) {
  const at::Tensor two = at::zeros({2, kHidden});
  // Two new tokens for sequence 1: rows for the old pending token and the first new one.
  auto rows = CheckHiddenObservations({{.seq = 1, .tokens = {5, 6}, .hidden = {two, two}}}, kVocab,
                                      2, kHidden, Seen);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ((*rows)[0], 2);
  auto bad = [&](const DrafterObservation& o, size_t layers, const std::string& text) {
    auto r = CheckHiddenObservations({o}, kVocab, layers, kHidden, Seen);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(r.status().message(), HasSubstr(text));
  };
  bad({.seq = 1, .tokens = {5, 6}, .hidden = {at::zeros({3, kHidden}), at::zeros({3, kHidden})}}, 2,
      "hidden-state rows");
  bad({.seq = 1, .tokens = {5, 6}, .hidden = {two}}, 2, "the drafter reads 2 layers");
  bad({.seq = 1, .tokens = {5, 6}, .hidden = {two, at::zeros({2, 7})}}, 2, "hidden[1] has shape");
  bad({.seq = 1, .tokens = {5, 64}, .hidden = {two, two}}, 2, "tokens[1] = 64");
  bad({.seq = 1, .tokens = {5, 6}, .hidden = {two}}, 0, "the drafter reads none");
  auto unknown = CheckHiddenObservations({{.seq = 3, .tokens = {1}}}, kVocab, 1, kHidden, Seen);
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  // Token-only (0 layers): rows follow from the tokens.
  auto token_only = CheckHiddenObservations({{.seq = 2, .tokens = {1, 2, 3}}}, kVocab, 0, 0, Seen);
  ASSERT_TRUE(token_only.ok());
  EXPECT_EQ((*token_only)[0], 2);
}

}  // namespace
}  // namespace specula
