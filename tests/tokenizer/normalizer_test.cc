#include "common/tokenizer/normalizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Normalizer> Parse(const char* json) {
  auto normalizer = ParseNormalizer(nlohmann::json::parse(json), "normalizer");
  EXPECT_TRUE(normalizer.ok()) << normalizer.status();
  return normalizer.ok() ? std::move(normalizer).value() : nullptr;
}

TEST(NormalizerTest, Llama2Sequence) {
  auto normalizer = Parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})");
  ASSERT_NE(normalizer, nullptr);
  EXPECT_EQ(normalizer->Normalize("Hello  world"), "▁Hello▁▁world");
  EXPECT_EQ(normalizer->Normalize(""), "");  // Prepend leaves empty text alone
}

TEST(NormalizerTest, ReplaceRegexAndStrip) {
  auto replace = Parse(R"({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})");
  ASSERT_NE(replace, nullptr);
  EXPECT_EQ(replace->Normalize("a \t\n b"), "a b");
  auto strip = Parse(R"({"type": "Strip", "strip_left": false, "strip_right": true})");
  ASSERT_NE(strip, nullptr);
  EXPECT_EQ(strip->Normalize("  x  \n"), "  x");
}

TEST(NormalizerTest, Nfc) {
  auto nfc = Parse(R"({"type": "NFC"})");
  ASSERT_NE(nfc, nullptr);
  EXPECT_EQ(nfc->Normalize("Cafe\xCC\x81"), "Caf\xC3\xA9");
}

TEST(NormalizerTest, NullAndUnsupported) {
  auto none = ParseNormalizer(nlohmann::json(), "normalizer");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto nfkc = ParseNormalizer(nlohmann::json{{"type", "NFKC"}}, "normalizer");
  EXPECT_EQ(nfkc.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(nfkc.status().message(), "normalizer.type 'NFKC' is not supported");
  auto bad = ParseNormalizer(nlohmann::json{{"type", "Prepend"}}, "normalizer");
  EXPECT_THAT(bad.status().message(), HasSubstr("normalizer.prepend is missing"));
}

}  // namespace
}  // namespace specula
