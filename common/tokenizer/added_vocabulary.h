// Added tokens ("added_tokens" in tokenizer.json): strings such as "<|endoftext|>" that are
// recognised verbatim in input text and bypass the model, plus whether each is special.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;  // match only when not inside a word
  bool lstrip = false;       // the match swallows whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched in normalized text rather than raw text
  bool special = false;      // skipped by Decode(skip_special_tokens=true)
};

class AddedVocabulary {
 public:
  // A run of `text` [begin, end): either plain text (id < 0) or one added token.
  struct Segment {
    size_t begin;
    size_t end;
    int32_t id;
  };

  AddedVocabulary() = default;
  explicit AddedVocabulary(std::vector<AddedToken> tokens);
  // Parses the "added_tokens" array; `path` names it in errors.
  static StatusOr<AddedVocabulary> FromJson(const nlohmann::json& json, std::string_view path);

  // Splits `text` at occurrences of the added tokens whose `normalized` flag equals `normalized`,
  // leftmost-longest first, as Hugging Face does. Appends segments covering all of `text`.
  void Split(std::string_view text, bool normalized, std::vector<Segment>* segments) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* FindByContent(std::string_view content) const;
  const AddedToken* FindById(int32_t id) const;

 private:
  // Byte trie over token contents; a node's `token` indexes tokens_ when a content ends there.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;
      int32_t token = -1;
    };
    std::vector<Node> nodes{1};
    bool first_byte[256] = {};

    void Insert(std::string_view content, int32_t token);
    // Index into tokens_ of the longest content starting at text[pos], or -1.
    int32_t LongestMatch(std::string_view text, size_t pos, size_t* length) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int32_t, size_t> by_id_;
  Trie raw_trie_;
  Trie normalized_trie_;
};

}  // namespace specula
