#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/regex.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

// single_word boundaries use the regex notion of a word character (letters, digits, '_').
bool IsWordChar(std::string_view ch) {
  static const Regex* const word_char = new Regex(*Regex::Compile(R"(\A\w\z)"));
  return word_char->Matches(ch);
}

std::string_view LastChar(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && s.size() - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  return s.substr(start);
}

}  // namespace

void AddedVocabulary::Trie::Insert(std::string_view content, int32_t token) {
  int32_t node = 0;
  for (char c : content) {
    const auto byte = static_cast<uint8_t>(c);
    auto& children = nodes[node].children;
    auto it = std::find_if(children.begin(), children.end(),
                           [byte](const auto& child) { return child.first == byte; });
    if (it == children.end()) {
      const auto child = static_cast<int32_t>(nodes.size());
      nodes[node].children.emplace_back(byte, child);
      nodes.emplace_back();
      node = child;
    } else {
      node = it->second;
    }
  }
  nodes[node].token = token;
  first_byte[static_cast<uint8_t>(content[0])] = true;
}

int32_t AddedVocabulary::Trie::LongestMatch(std::string_view text, size_t pos,
                                            size_t* length) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    const auto& children = nodes[node].children;
    const auto it = std::find_if(children.begin(), children.end(),
                                 [byte](const auto& child) { return child.first == byte; });
    if (it == children.end()) break;
    node = it->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      *length = i + 1 - pos;
    }
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    by_content_[token.content] = i;
    by_id_[token.id] = i;
    if (token.content.empty()) continue;
    (token.normalized ? normalized_trie_ : raw_trie_)
        .Insert(token.content, static_cast<int32_t>(i));
  }
}

StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const nlohmann::json& json,
                                                    std::string_view path) {
  namespace jf = json_fields;
  if (json.is_null()) return AddedVocabulary();
  if (!json.is_array()) return InvalidArgumentError(StrCat(path, " must be an array"));
  std::vector<AddedToken> tokens;
  for (size_t i = 0; i < json.size(); ++i) {
    const std::string item_path = jf::Index(path, i);
    const nlohmann::json& item = json[i];
    AddedToken token;
    ASSIGN_OR_RETURN(int64_t id, jf::Int(item, "id", item_path));
    if (id < 0 || id > INT32_MAX) {
      return InvalidArgumentError(StrCat(jf::Path(item_path, "id"), " ", id, " is out of range"));
    }
    token.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(token.content, jf::String(item, "content", item_path));
    if (token.content.empty()) {
      return InvalidArgumentError(StrCat(jf::Path(item_path, "content"), " must not be empty"));
    }
    ASSIGN_OR_RETURN(token.single_word, jf::BoolOr(item, "single_word", item_path, false));
    ASSIGN_OR_RETURN(token.lstrip, jf::BoolOr(item, "lstrip", item_path, false));
    ASSIGN_OR_RETURN(token.rstrip, jf::BoolOr(item, "rstrip", item_path, false));
    ASSIGN_OR_RETURN(token.special, jf::BoolOr(item, "special", item_path, false));
    ASSIGN_OR_RETURN(token.normalized, jf::BoolOr(item, "normalized", item_path, !token.special));
    tokens.push_back(std::move(token));
  }
  return AddedVocabulary(std::move(tokens));
}

void AddedVocabulary::Split(std::string_view text, bool normalized,
                            std::vector<Segment>* segments) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  size_t text_start = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int32_t index = trie.LongestMatch(text, pos, &length);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + length;
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordChar(LastChar(text.substr(0, start)));
      const bool word_after =
          stop < text.size() && IsWordChar(text.substr(stop, utf8::CharLength(text, stop)));
      if (word_before || word_after) {
        pos = stop;  // like Hugging Face's non-overlapping search, resume after the rejected match
        continue;
      }
    }
    if (token.lstrip) {
      start = std::max(utf8::TrailingWhitespaceStart(text.substr(0, start)), text_start);
    }
    if (token.rstrip) stop += utf8::LeadingWhitespaceLength(text.substr(stop));
    if (text_start < start) segments->push_back({text_start, start, -1});
    segments->push_back({start, stop, token.id});
    text_start = stop;
    pos = stop;
  }
  if (text_start < text.size()) segments->push_back({text_start, text.size(), -1});
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace specula
