#include "common/tokenizer/post_processor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::unique_ptr<PostProcessor> Parse(const char* json) {
  auto processor = ParsePostProcessor(nlohmann::json::parse(json), "post_processor");
  EXPECT_TRUE(processor.ok()) << processor.status();
  return processor.ok() ? std::move(processor).value() : nullptr;
}

constexpr const char* kLlama3 = R"({"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}}],
     "pair": [],
     "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                              "tokens": ["<|begin_of_text|>"]}}}]})";

TEST(PostProcessorTest, TemplateAddsBos) {
  auto processor = Parse(kLlama3);
  ASSERT_NE(processor, nullptr);
  std::vector<int32_t> ids = {5, 6};
  processor->Process(&ids);
  EXPECT_THAT(ids, ElementsAre(128000, 5, 6));
  EXPECT_EQ(processor->LeadingId(), 128000);
}

TEST(PostProcessorTest, TemplateAroundSequence) {
  auto processor = Parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
                 {"SpecialToken": {"id": "</s>"}}],
      "special_tokens": {"<s>": {"ids": [1]}, "</s>": {"ids": [2]}}})");
  ASSERT_NE(processor, nullptr);
  std::vector<int32_t> ids = {9};
  processor->Process(&ids);
  EXPECT_THAT(ids, ElementsAre(1, 9, 2));
}

TEST(PostProcessorTest, RobertaAndByteLevel) {
  auto roberta = Parse(R"({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})");
  ASSERT_NE(roberta, nullptr);
  std::vector<int32_t> ids = {7};
  roberta->Process(&ids);
  EXPECT_THAT(ids, ElementsAre(0, 7, 2));
  EXPECT_EQ(roberta->LeadingId(), 0);
  auto byte_level = Parse(R"({"type": "ByteLevel", "trim_offsets": true})");
  ASSERT_NE(byte_level, nullptr);
  byte_level->Process(&ids);
  EXPECT_THAT(ids, ElementsAre(0, 7, 2));
  EXPECT_EQ(byte_level->LeadingId(), std::nullopt);
}

TEST(PostProcessorTest, Errors) {
  const auto parse = [](const char* json) {
    return ParsePostProcessor(nlohmann::json::parse(json), "post_processor").status();
  };
  EXPECT_THAT(
      parse(R"({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A"}}]})").message(),
      HasSubstr("post_processor.special_tokens is missing"));
  EXPECT_THAT(
      parse(R"({"type": "TemplateProcessing", "single": [], "special_tokens": {}})").message(),
      HasSubstr("post_processor.single has no Sequence entry"));
  EXPECT_EQ(parse(R"({"type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]"]})").message(),
            "post_processor.cls must be a [token, id] pair with a non-negative id");
  const Status unsupported = parse(R"({"type": "Fancy"})");
  EXPECT_EQ(unsupported.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(unsupported.message(), "post_processor.type 'Fancy' is not supported");
}

}  // namespace
}  // namespace specula
