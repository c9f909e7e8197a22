#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/tokenizer/test_tokenizers.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::unique_ptr<Tokenizer> Load(const Json& config) {
  auto tokenizer = Tokenizer::FromJson(config.dump(), "test.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

Status LoadError(const Json& config) {
  auto tokenizer = Tokenizer::FromJson(config.dump(), "tokenizer.json");
  return tokenizer.status();
}

TEST(TokenizerTest, ByteLevelHandVectors) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("the cat"), ElementsAre(257, 260));
  // "a t" (rank 3) only applies after "t h" (rank 0).
  EXPECT_THAT(tok->Encode("that"), ElementsAre(256, 259));
  // ' ' is byte 32 ('Ġ'); "Ġh" has no merge.
  EXPECT_THAT(tok->Encode("the hat"), ElementsAre(257, 32, 104, 259));
  // Two bytes of 'é' (C3 A9) are two byte-level symbols.
  EXPECT_THAT(tok->Encode("\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_EQ(*tok->Decode({257, 260}), "the cat");
  EXPECT_EQ(*tok->Decode({0xC3, 0xA9}), "\xC3\xA9");
  // Half a character decodes to U+FFFD.
  EXPECT_EQ(*tok->Decode({116, 0xC3}), "t\xEF\xBF\xBD");
}

TEST(TokenizerTest, ByteLevelSpecialTokenInText) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("the<|endoftext|>cat"), ElementsAre(257, 261, 99, 259));
  EXPECT_EQ(*tok->Decode({257, 261, 99, 259}), "the<|endoftext|>cat");
  EXPECT_EQ(*tok->Decode({257, 261, 99, 259}, /*skip_special_tokens=*/true), "thecat");
  EXPECT_TRUE(tok->IsSpecial(261));
  EXPECT_FALSE(tok->IsSpecial(257));
  EXPECT_EQ(tok->TokenToId("<|endoftext|>"), 261);
  EXPECT_EQ(tok->TokenToId("\u0120cat"), 260);
  EXPECT_EQ(tok->TokenToId("dog"), std::nullopt);
  EXPECT_EQ(tok->IdToToken(260), "\u0120cat");
  EXPECT_EQ(tok->IdToToken(5000), "");
  EXPECT_EQ(tok->vocab_size(), 262);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
}

TEST(TokenizerTest, ByteLevelRoundTripsArbitraryBytes) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  static constexpr char kText[] = "caf\xC3\xA9 \xF0\x9F\x98\x80\n\t\0 bad \xFF\xC3 end";
  const std::string text(kText, sizeof(kText) - 1);
  const auto bytes = tok->DecodeBytes(tok->Encode(text));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, text);
}

TEST(TokenizerTest, SentencePieceHandVectors) {
  auto tok = Load(testing::SentencePieceTestConfig());
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello world"), ElementsAre(1, 271, 272, 273, 262, 266));
  EXPECT_THAT(tok->Encode("hello world", /*add_special_tokens=*/false),
              ElementsAre(271, 272, 273, 262, 266));
  // 'é' is not in the vocabulary: byte fallback to <0xC3> <0xA9> (ids 3 + byte).
  EXPECT_THAT(tok->Encode("hello \xC3\xA9"), ElementsAre(1, 271, 259, 3 + 0xC3, 3 + 0xA9));
  // U+1F600 is four byte tokens.
  EXPECT_THAT(tok->Encode("\xF0\x9F\x98\x80", false),
              ElementsAre(259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80));
  EXPECT_EQ(tok->bos_id(), 1);
}

TEST(TokenizerTest, SentencePieceSpecialTokenInText) {
  auto tok = Load(testing::SentencePieceTestConfig());
  ASSERT_NE(tok, nullptr);
  // Each text run around an added token is normalized on its own (Prepend adds "▁" to both), as in
  // Hugging Face.
  EXPECT_THAT(tok->Encode("hello</s>world"), ElementsAre(1, 271, 2, 272, 273, 262, 266));
}

TEST(TokenizerTest, SentencePieceDecode) {
  auto tok = Load(testing::SentencePieceTestConfig());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(*tok->Decode({1, 271, 272, 273, 262, 266}, true), "hello world");
  EXPECT_EQ(*tok->Decode({1, 271, 259, 3 + 0xC3, 3 + 0xA9}, true), "hello \xC3\xA9");
  EXPECT_EQ(*tok->Decode({1, 271}), "<s> hello");
  for (const std::string text : {"hello world", "hello \xC3\xA9 \xF0\x9F\x98\x80 wow", "x  y"}) {
    EXPECT_EQ(*tok->Decode(tok->Encode(text), true), text);
  }
}

TEST(TokenizerTest, MetaspacePreTokenizerWithPrependFirst) {
  Json config = testing::SentencePieceTestConfig();
  config["normalizer"] = nullptr;
  config["pre_tokenizer"] = {{"type", "Metaspace"},
                             {"replacement", "\u2581"},
                             {"prepend_scheme", "first"},
                             {"split", true}};
  config["decoder"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}};
  auto tok = Load(config);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("hello world", false), ElementsAre(271, 272, 273, 262, 266));
  // "first": only the run at the start of the text gets the prepended "▁".
  EXPECT_THAT(tok->Encode("hello</s>world", false), ElementsAre(271, 2, 264, 273, 262, 266));
  EXPECT_EQ(*tok->Decode({271, 272, 273, 262, 266}), "hello world");
}

TEST(TokenizerTest, Llama3StyleIgnoreMerges) {
  // Llama-3 layout: Split(regex) + ByteLevel(use_regex=false); with ignore_merges a pre-token that
  // is itself in the vocabulary is emitted whole even if no merge path builds it.
  Json config = testing::ByteLevelTestConfig();
  config["model"]["vocab"]["\u0120dog"] = 262;
  config["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern",
          {{"Regex",
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
            "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
            "\\s+(?!\\S)|\\s+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  auto without = Load(config);
  ASSERT_NE(without, nullptr);
  EXPECT_THAT(without->Encode("the dog"), ElementsAre(257, 32, 100, 111, 103));
  config["model"]["ignore_merges"] = true;
  auto with = Load(config);
  ASSERT_NE(with, nullptr);
  EXPECT_THAT(with->Encode("the dog"), ElementsAre(257, 262));
  // Digits come in groups of at most three: "1234" -> "123", "4".
  EXPECT_THAT(with->Encode("1234"), ElementsAre('1', '2', '3', '4'));
  EXPECT_EQ(*with->Decode(with->Encode("x = 12345\n\n  y")), "x = 12345\n\n  y");
}

TEST(TokenizerTest, QwenStyleNfcNormalizer) {
  // Qwen2/3 normalize to NFC first: a decomposed "é" encodes like the precomposed one.
  Json config = testing::ByteLevelTestConfig();
  config["normalizer"] = {{"type", "NFC"}};
  auto tok = Load(config);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("e\xCC\x81"), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(tok->Encode("the<|endoftext|>e\xCC\x81"), ElementsAre(257, 261, 0xC3, 0xA9));
}

TEST(TokenizerTest, AddedTokenStripping) {
  Json config = testing::ByteLevelTestConfig();
  config["added_tokens"].push_back({{"id", 262},
                                    {"content", "<mask>"},
                                    {"single_word", false},
                                    {"lstrip", true},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", false}});
  auto tok = Load(config);
  ASSERT_NE(tok, nullptr);
  // lstrip: the space before <mask> belongs to the added token.
  EXPECT_THAT(tok->Encode("the <mask>"), ElementsAre(257, 262));
  EXPECT_FALSE(tok->IsSpecial(262));
  EXPECT_EQ(*tok->Decode({257, 262}, /*skip_special_tokens=*/true), "the<mask>");
}

TEST(TokenizerTest, DecodeRejectsUnknownIds) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  const auto result = tok->Decode({257, 262});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("token id 262"));
  EXPECT_EQ(tok->Decode({-1}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, MissingFileIsNotFound) {
  const auto result = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr("/nonexistent/dir/tokenizer.json"));
}

TEST(TokenizerTest, MalformedJsonNamesTheSource) {
  const auto result = Tokenizer::FromJson("{\"model\": {", "models/x/tokenizer.json");
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("models/x/tokenizer.json: malformed JSON"));
  EXPECT_EQ(Tokenizer::FromJson("[1, 2]", "t.json").status().code(), StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, UnsupportedComponentsNameTheField) {
  Json config = testing::ByteLevelTestConfig();
  config["pre_tokenizer"] = {{"type", "Whitespace"}};
  Status status = LoadError(config);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(), "tokenizer.json: pre_tokenizer.type 'Whitespace' is not supported");

  config = testing::ByteLevelTestConfig();
  config["model"]["type"] = "Unigram";
  status = LoadError(config);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(status.message(), "tokenizer.json: model.type 'Unigram' is not supported");

  config = testing::SentencePieceTestConfig();
  config["normalizer"]["normalizers"][1] = {{"type", "NFKC"}};
  status = LoadError(config);
  EXPECT_EQ(status.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("normalizer.normalizers[1].type 'NFKC'"));

  config = testing::SentencePieceTestConfig();
  config["decoder"]["decoders"][0] = {{"type", "WordPiece"}};
  EXPECT_THAT(LoadError(config).message(), HasSubstr("decoder.decoders[0].type 'WordPiece'"));
}

TEST(TokenizerTest, BadFieldsNameTheField) {
  Json config = testing::ByteLevelTestConfig();
  config["model"]["merges"][1] = "th zz";
  Status status = LoadError(config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "tokenizer.json: model.merges[1]: token 'zz' is not in model.vocab");

  config = testing::ByteLevelTestConfig();
  config.erase("model");
  EXPECT_EQ(LoadError(config).message(), "tokenizer.json: model is missing");

  config = testing::ByteLevelTestConfig();
  config["pre_tokenizer"]["add_prefix_space"] = "yes";
  EXPECT_EQ(LoadError(config).message(),
            "tokenizer.json: pre_tokenizer.add_prefix_space must be a boolean, got string");

  config = testing::ByteLevelTestConfig();
  config["added_tokens"][0].erase("content");
  EXPECT_EQ(LoadError(config).message(), "tokenizer.json: added_tokens[0].content is missing");

  config = testing::SentencePieceTestConfig();
  config["post_processor"]["single"][0]["SpecialToken"]["id"] = "<bos>";
  EXPECT_THAT(LoadError(config).message(),
              HasSubstr("post_processor.single[0].SpecialToken.id '<bos>' is not in "
                        "post_processor.special_tokens"));

  config = testing::ByteLevelTestConfig();
  config["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  status = LoadError(config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("pre_tokenizer.pattern.Regex: regex '(unclosed'"));
}

}  // namespace
}  // namespace specula
