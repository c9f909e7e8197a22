#include "common/tokenizer/json_fields.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace specula::json_fields {
namespace {

TEST(JsonFieldsTest, Paths) {
  EXPECT_EQ(Path("", "model"), "model");
  EXPECT_EQ(Path("model", "vocab"), "model.vocab");
  EXPECT_EQ(Index("decoder.decoders", 2), "decoder.decoders[2]");
}

TEST(JsonFieldsTest, TypedAccess) {
  const auto json =
      nlohmann::json::parse(R"({"s": "x", "b": true, "i": 7, "a": [1], "o": {}, "n": null})");
  EXPECT_EQ(*String(json, "s", "p"), "x");
  EXPECT_EQ(*StringOr(json, "n", "p", "default"), "default");
  EXPECT_EQ(*StringOr(json, "missing", "p", "default"), "default");
  EXPECT_TRUE(*BoolOr(json, "b", "p", false));
  EXPECT_TRUE(*BoolOr(json, "n", "p", true));
  EXPECT_EQ(*Int(json, "i", "p"), 7);
  EXPECT_EQ(*IntOr(json, "missing", "p", 3), 3);
  EXPECT_EQ((*Array(json, "a", "p"))->size(), 1u);
  EXPECT_TRUE((*Object(json, "o", "p"))->is_object());
}

TEST(JsonFieldsTest, ErrorsNameTheField) {
  const auto json = nlohmann::json::parse(R"({"s": 1, "n": null})");
  EXPECT_EQ(String(json, "s", "decoder").status().message(),
            "decoder.s must be a string, got number");
  EXPECT_EQ(String(json, "n", "decoder").status().message(), "decoder.n is missing");
  EXPECT_EQ(BoolOr(json, "s", "x", false).status().message(), "x.s must be a boolean, got number");
  EXPECT_EQ(Type(nlohmann::json::array(), "pre_tokenizer").status().message(),
            "pre_tokenizer must be an object, got array");
  const Status unsupported = UnsupportedType("normalizer", "NFC");
  EXPECT_EQ(unsupported.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(unsupported.message(), "normalizer.type 'NFC' is not supported");
}

}  // namespace
}  // namespace specula::json_fields
