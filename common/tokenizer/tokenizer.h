// Hugging Face tokenizer.json tokenizers: loading, encoding and decoding.
//
// Supports the BPE tokenizers of the model families Specula serves: byte-level BPE with a regex
// pre-tokenizer (GPT-2, Llama-3, Qwen2/3 with their NFC normalizer, the bundled model) and
// SentencePiece-style BPE with Metaspace or Prepend/Replace normalizers and byte_fallback (Llama-2,
// Mistral). Encoding runs the Hugging Face pipeline: added tokens are split out of the raw text,
// the rest is normalized, pre-tokenized and BPE-encoded, then the post-processor adds special
// tokens.
//
// Unsupported components (Unigram/WordPiece models, NFKC and other normalizers, ...) fail to load
// with UNIMPLEMENTED naming the field, never silently. See stream_decoder.h for incremental
// decoding and bpe_trainer.h for training.
//
// Thread-safe: all const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace specula {

class AddedVocabulary;
class BpeModel;
class Decoder;
class Normalizer;
class PostProcessor;
class PreTokenizer;

class Tokenizer {
 public:
  // NOT_FOUND if `path` cannot be read; otherwise as FromJson, with errors prefixed by `path`.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // `source_name` prefixes every error ("tokenizer.json: pre_tokenizer.type 'X' is not
  // supported"). INVALID_ARGUMENT for malformed JSON or bad fields, UNIMPLEMENTED for component
  // types this module does not implement.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json,
                                                       std::string_view source_name);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Added and special tokens written literally in `text` are emitted as their ids.
  // `add_special_tokens` applies the post-processor (e.g. Llama's BOS). Any byte string is
  // accepted: with byte-level BPE and no normalizer, DecodeBytes(Encode(text)) == text for every
  // input (and Decode too when `text` is well-formed UTF-8).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = true) const;

  // The text of `ids`; ill-formed UTF-8 in the result (e.g. a character cut in half at the end) is
  // replaced with U+FFFD. INVALID_ARGUMENT naming the first id outside the vocabulary.
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids,
                               bool skip_special_tokens = false) const;
  // As Decode, but returns the decoded bytes before U+FFFD replacement: Decode(ids) ==
  // utf8::ToValid(DecodeBytes(ids)). StreamDecoder builds on this.
  StatusOr<std::string> DecodeBytes(const std::vector<int32_t>& ids,
                                    bool skip_special_tokens = false) const;

  // Max id + 1 over the model vocabulary and the added tokens.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string as stored in tokenizer.json (byte-level form for byte-level BPE); "" for an
  // id that names no token.
  std::string IdToToken(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // The beginning-of-sequence id: the special token the post-processor puts first, else the first
  // of "<|begin_of_text|>", "<s>", "<bos>" present in the vocabulary.
  std::optional<int32_t> bos_id() const { return bos_id_; }

 private:
  Tokenizer();
  // Fills id_to_token_, id_kind_ and bos_id_ once the components are parsed.
  void IndexIds();

  std::unique_ptr<AddedVocabulary> added_;
  std::unique_ptr<Normalizer> normalizer_;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer_;  // may be null
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;  // may be null
  std::unique_ptr<Decoder> decoder_;               // may be null

  enum class IdKind : uint8_t { kNone, kNormal, kSpecial };
  std::vector<std::string> id_to_token_;  // added tokens override the model's strings
  std::vector<IdKind> id_kind_;
  std::optional<int32_t> bos_id_;
};

}  // namespace specula
