// Fuzzes tokenization of arbitrary bytes with the bundled model's byte-level BPE tokenizer: every
// input encodes, every id is in the vocabulary, and decoding gives the input back byte for byte
// (tokenizer.h: DecodeBytes(Encode(text)) == text for byte-level BPE without a normalizer). The
// stream decoder, fed the ids one at a time, must give Decode's text.
#include <cstdint>
#include <memory>
#include <string>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const specula::Tokenizer& Bundled() {
  static const std::unique_ptr<specula::Tokenizer> tokenizer = [] {
    auto t = specula::Tokenizer::FromFile(std::string(SPECULA_SOURCE_DIR) +
                                          "/models/pyllama-6m/tokenizer.json");
    if (!t.ok()) specula::fuzz::Fail("cannot load models/pyllama-6m/tokenizer.json");
    return std::move(*t);
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specula;
  const Tokenizer& t = Bundled();
  const std::string text(fuzz::AsText(data, size));
  const std::vector<int32_t> ids = t.Encode(text, /*add_special_tokens=*/false);
  for (int32_t id : ids) {
    if (id < 0 || id >= t.vocab_size()) fuzz::Fail("a token id outside the vocabulary");
  }
  auto bytes = t.DecodeBytes(ids);
  if (!bytes.ok()) fuzz::Fail("DecodeBytes failed on Encode's ids");
  if (*bytes != text) fuzz::Fail("DecodeBytes(Encode(text)) != text");
  auto decoded = t.Decode(ids);
  if (!decoded.ok()) fuzz::Fail("Decode failed on Encode's ids");
  StreamDecoder stream(t, /*skip_special_tokens=*/false);
  std::string streamed;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    if (!piece.ok()) fuzz::Fail("StreamDecoder::Push failed");
    streamed += *piece;
  }
  streamed += stream.Flush();
  if (streamed != *decoded) fuzz::Fail("streamed text != Decode");
  return 0;
}
