// Incremental detokenization for streaming generated tokens to clients.
//
// Push() returns the text that the new token completes. Bytes of a character split across tokens
// (byte-level BPE, <0xNN> byte fallback) are held back until the character is complete, so no chunk
// ever ends in half a UTF-8 character; bytes that can never become a character are emitted as
// U+FFFD. The concatenation of all chunks plus Flush() equals Tokenizer::Decode of all pushed ids.
//
// Decoders that treat the first token specially (Metaspace and Strip drop its leading space) are
// handled by decoding each new token together with the last token that produced output.
//
// Not thread-safe: one StreamDecoder per sequence. The Tokenizer must outlive it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"

namespace specula {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Newly completed text, possibly "". INVALID_ARGUMENT if `id` is outside the vocabulary (the
  // decoder's state is then unchanged).
  StatusOr<std::string> Push(int32_t id);

  // Whatever is still held back, with unfinished characters replaced by U+FFFD. Later pushes
  // continue the same sequence.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> context_;  // the last id that produced output, if any
  std::string context_bytes_;     // DecodeBytes(context_)
  std::string pending_;           // decoded bytes not yet returned
};

}  // namespace specula
