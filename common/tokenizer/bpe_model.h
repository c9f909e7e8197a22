// The BPE model of tokenizer.json: vocabulary, ranked merges, and the per-word merge loop.
//
// Covers byte-level BPE (GPT-2, Llama-3, Qwen) and SentencePiece-style BPE (Llama-2, Mistral):
// byte_fallback (characters missing from the vocabulary become <0xNN> tokens), unk_token with
// fuse_unk, ignore_merges (a word already in the vocabulary is one token),
// continuing_subword_prefix and end_of_word_suffix. BPE dropout is a training-time regulariser and
// is rejected if non-zero.
//
// Thread-safe: Encode may be called concurrently; it shares a bounded cache of encoded words.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

class BpeModel {
 public:
  // Parses the "model" field. `path` names it in errors ("model").
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& json,
                                                      std::string_view path);

  // Appends the ids of one pre-tokenized word.
  void Encode(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr if no token has this id.
  const std::string* IdToToken(int32_t id) const;
  // Max id + 1.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  BpeModel() = default;
  // Splits `word` into initial symbols (characters, byte fallbacks, unknowns).
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;
  // Applies merges lowest rank first (leftmost first among equal ranks) until none applies.
  void MergeSymbols(std::vector<int32_t>* symbols) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_fallback_ids_[256] = {};  // valid when byte_fallback_ and all 256 exist; else -1

  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace specula
