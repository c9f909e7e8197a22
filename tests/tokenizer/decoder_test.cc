#include "common/tokenizer/decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Decode(const char* json, std::vector<std::string> tokens) {
  auto decoder = ParseDecoder(nlohmann::json::parse(json), "decoder");
  EXPECT_TRUE(decoder.ok()) << decoder.status();
  if (decoder.ok()) (*decoder)->DecodeChain(&tokens);
  return tokens;
}

TEST(DecoderTest, ByteLevel) {
  EXPECT_THAT(Decode(R"({"type": "ByteLevel"})", {"Hello", "\u0120w\u00C3\u00A9", "<|a b|>"}),
              ElementsAre("Hello w\xC3\xA9<|a b|>"));
  // Half a character stays as raw bytes; Tokenizer::Decode replaces it later.
  EXPECT_THAT(Decode(R"({"type": "ByteLevel"})", {"\u00C3"}), ElementsAre("\xC3"));
}

TEST(DecoderTest, Llama2Sequence) {
  const char* llama2 = R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})";
  EXPECT_THAT(Decode(llama2, {"\u2581Hello", "\u2581", "<0xC3>", "<0xA9>", "!"}),
              ElementsAre("Hello \xC3\xA9!"));
  EXPECT_THAT(Decode(llama2, {"\u2581\u2581x"}), ElementsAre(" x"));
}

TEST(DecoderTest, ByteFallbackGroupsBytes) {
  EXPECT_THAT(Decode(R"({"type": "ByteFallback"})",
                     {"a", "<0xE2>", "<0x82>", "<0xAC>", "b", "<0xff>", "<0xZZ>"}),
              ElementsAre("a", "\xE2\x82\xAC", "b", "\xFF", "<0xZZ>"));
}

TEST(DecoderTest, StripAndMetaspace) {
  EXPECT_THAT(
      Decode(R"({"type": "Strip", "content": "x", "start": 2, "stop": 1})", {"xxxaxx", "ax"}),
      ElementsAre("xax", "a"));
  EXPECT_THAT(Decode(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"})",
                     {"\u2581Hi", "\u2581there"}),
              ElementsAre("Hi", " there"));
  EXPECT_THAT(Decode(R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"})",
                     {"\u2581Hi"}),
              ElementsAre(" Hi"));
}

TEST(DecoderTest, Errors) {
  const auto parse = [](const char* json) {
    return ParseDecoder(nlohmann::json::parse(json), "decoder").status();
  };
  EXPECT_EQ(parse(R"({"type": "WordPiece"})").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(parse(R"({"type": "Strip", "content": "ab"})").message(),
            "decoder.content must be one character");
  EXPECT_EQ(parse(R"({"type": "Sequence", "decoders": [{"type": "CTC"}]})").message(),
            "decoder.decoders[0].type 'CTC' is not supported");
  EXPECT_EQ(parse(R"({"type": "Metaspace", "prepend_scheme": "sometimes"})").message(),
            "decoder.prepend_scheme 'sometimes' is not one of first, always, never");
}

}  // namespace
}  // namespace specula
