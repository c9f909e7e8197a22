#include "common/tokenizer/stream_decoder.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tokenizer/bpe_trainer.h"
#include "common/tokenizer/utf8.h"
#include "tests/tokenizer/test_tokenizers.h"

namespace specula {
namespace {

using ::testing::ElementsAre;

std::unique_ptr<Tokenizer> Load(const nlohmann::json& config) {
  auto tokenizer = Tokenizer::FromJson(config.dump(), "test.json");
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

// Pushes every id; checks each chunk is well-formed UTF-8 and returns the chunks (Flush last).
std::vector<std::string> Stream(const Tokenizer& tok, const std::vector<int32_t>& ids,
                                bool skip_special_tokens = true) {
  StreamDecoder decoder(tok, skip_special_tokens);
  std::vector<std::string> chunks;
  for (const int32_t id : ids) {
    auto chunk = decoder.Push(id);
    EXPECT_TRUE(chunk.ok()) << chunk.status();
    if (!chunk.ok()) return chunks;
    EXPECT_TRUE(utf8::IsValid(*chunk)) << "chunk after id " << id << " is not valid UTF-8";
    chunks.push_back(*chunk);
  }
  chunks.push_back(decoder.Flush());
  return chunks;
}

std::string Join(const std::vector<std::string>& chunks) {
  std::string out;
  for (const std::string& chunk : chunks) out += chunk;
  return out;
}

TEST(StreamDecoderTest, HoldsBackSplitCharacters) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  // Without merges for them, every byte of "é" (2), "€" (3) and "😀" (4) is its own token.
  const std::string text = "the caf\xC3\xA9 \xE2\x82\xAC 5 \xF0\x9F\x98\x80!";
  const std::vector<int32_t> ids = tok->Encode(text);
  const std::vector<std::string> chunks = Stream(*tok, ids);
  EXPECT_EQ(Join(chunks), text);
  EXPECT_EQ(Join(chunks), *tok->Decode(ids));
  // The first byte of "😀" completes nothing; its last byte completes the whole character.
  const auto emoji = std::find(ids.begin(), ids.end(), 0xF0) - ids.begin();
  EXPECT_EQ(chunks[emoji], "");
  EXPECT_EQ(chunks[emoji + 3], "\xF0\x9F\x98\x80");
}

TEST(StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  // 0xFF can never start a character: emitted at once. A dangling 0xC3 waits for Flush.
  EXPECT_THAT(Stream(*tok, {'a', 0xFF, 'b', 0xC3}),
              ElementsAre("a", "\xEF\xBF\xBD", "b", "", "\xEF\xBF\xBD"));
  EXPECT_EQ(*tok->Decode({'a', 0xFF, 'b', 0xC3}),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  // 0xC3 followed by 'x' is ill-formed as soon as 'x' arrives.
  EXPECT_THAT(Stream(*tok, {0xC3, 'x'}), ElementsAre("", "\xEF\xBF\xBDx", ""));
}

TEST(StreamDecoderTest, FirstTokenRulesAndSpecialTokens) {
  auto tok = Load(testing::SentencePieceTestConfig());
  ASSERT_NE(tok, nullptr);
  // BOS, "▁hello", "▁", <0xC3>, <0xA9>, "▁w", "or", "l", "d". The Strip decoder removes the leading
  // space of the first piece only; the split "é" comes out whole.
  const std::vector<int32_t> ids = tok->Encode("hello \xC3\xA9 world");
  EXPECT_THAT(Stream(*tok, ids),
              ElementsAre("", "hello", " ", "", "\xC3\xA9", " w", "or", "l", "d", ""));
  EXPECT_EQ(Join(Stream(*tok, ids)), *tok->Decode(ids, true));
  // A skipped special token in the middle does not make the next token "first".
  const std::vector<int32_t> with_eos = {271, 2, 272, 273};
  EXPECT_EQ(Join(Stream(*tok, with_eos)), *tok->Decode(with_eos, true));
  EXPECT_EQ(Join(Stream(*tok, with_eos)), "hello wor");
  EXPECT_EQ(Join(Stream(*tok, with_eos, /*skip_special_tokens=*/false)),
            *tok->Decode(with_eos, false));
}

TEST(StreamDecoderTest, MatchesDecodeOnTrainedTokenizer) {
  BpeTrainerOptions options;
  options.vocab_size = 400;
  options.show_progress = false;
  const std::string text =
      "# Grüße, naïve café — 日本語のテキスト 🙂🙂\ndef f(x):\n    return x  # "
      "ок\n";
  const auto json = TrainByteLevelBpe({text, text}, options);
  ASSERT_TRUE(json.ok()) << json.status();
  auto tok = Tokenizer::FromJson(*json, "trained");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> ids = (*tok)->Encode(text + "<|endoftext|>" + text);
  EXPECT_EQ(Join(Stream(**tok, ids, false)), *(*tok)->Decode(ids, false));
  EXPECT_EQ(Join(Stream(**tok, ids, true)), text + text);
}

TEST(StreamDecoderTest, RejectsUnknownIdAndKeepsState) {
  auto tok = Load(testing::ByteLevelTestConfig());
  ASSERT_NE(tok, nullptr);
  StreamDecoder decoder(*tok);
  EXPECT_EQ(*decoder.Push(0xC3), "");
  const auto bad = decoder.Push(9999);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*decoder.Push(0xA9), "\xC3\xA9");
  EXPECT_EQ(decoder.Flush(), "");
}

}  // namespace
}  // namespace specula
