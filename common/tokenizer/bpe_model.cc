#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

namespace jf = json_fields;

// Words longer than this are rare (minified data, Llama-2 style text without a pre-tokenizer) and
// would only crowd the cache.
constexpr size_t kMaxCachedWordBytes = 256;
// Bounds cache memory (~10-20 MB when full); enough for all distinct words of a large code corpus.
constexpr size_t kCacheCapacity = size_t{1} << 17;
// Guards against files whose ids would make the id table absurdly large.
constexpr int64_t kMaxId = int64_t{1} << 24;

// Splits a merges entry, written either as "left right" or as ["left", "right"].
Status ParseMergeEntry(const nlohmann::json& entry, std::string_view path, std::string* left,
                       std::string* right) {
  if (entry.is_string()) {
    const auto& line = entry.get_ref<const std::string&>();
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return InvalidArgumentError(
          StrCat(path, " '", line, "' must be two tokens separated by one space"));
    }
    *left = line.substr(0, space);
    *right = line.substr(space + 1);
    return OkStatus();
  }
  if (entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string()) {
    *left = entry[0].get<std::string>();
    *right = entry[1].get<std::string>();
    return OkStatus();
  }
  return InvalidArgumentError(
      StrCat(path, " must be a \"left right\" string or a [left, right] pair"));
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& json,
                                                       std::string_view path) {
  std::unique_ptr<BpeModel> model(new BpeModel());

  const std::string vocab_path = jf::Path(path, "vocab");
  ASSIGN_OR_RETURN(const nlohmann::json* vocab, jf::Object(json, "vocab", path));
  model->vocab_.reserve(vocab->size());
  for (const auto& [token, id_json] : vocab->items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= kMaxId) {
      return InvalidArgumentError(StrCat(vocab_path, "['", token,
                                         "'] must be an integer id in [0, ", kMaxId, "), got ",
                                         id_json.dump()));
    }
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    model->vocab_.emplace(token, id);
    if (static_cast<size_t>(id) >= model->id_to_token_.size()) {
      model->id_to_token_.resize(id + 1);
      model->has_id_.resize(id + 1, false);
    }
    model->id_to_token_[id] = token;
    model->has_id_[id] = true;
  }

  ASSIGN_OR_RETURN(std::string unk, jf::StringOr(json, "unk_token", path, ""));
  if (!unk.empty()) {
    const auto unk_id = model->TokenToId(unk);
    if (!unk_id.has_value()) {
      return InvalidArgumentError(
          StrCat(jf::Path(path, "unk_token"), " '", unk, "' is not in ", vocab_path));
    }
    model->unk_id_ = unk_id;
  }
  ASSIGN_OR_RETURN(model->fuse_unk_, jf::BoolOr(json, "fuse_unk", path, false));
  ASSIGN_OR_RETURN(model->byte_fallback_, jf::BoolOr(json, "byte_fallback", path, false));
  ASSIGN_OR_RETURN(model->ignore_merges_, jf::BoolOr(json, "ignore_merges", path, false));
  ASSIGN_OR_RETURN(model->continuing_subword_prefix_,
                   jf::StringOr(json, "continuing_subword_prefix", path, ""));
  ASSIGN_OR_RETURN(model->end_of_word_suffix_, jf::StringOr(json, "end_of_word_suffix", path, ""));
  if (json.contains("dropout") && !json["dropout"].is_null()) {
    if (!json["dropout"].is_number()) {
      return InvalidArgumentError(StrCat(jf::Path(path, "dropout"), " must be a number or null"));
    }
    if (json["dropout"].get<double>() > 0.0) {
      return UnimplementedError(
          StrCat(jf::Path(path, "dropout"), " (BPE dropout) is not supported; set it to null"));
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    model->byte_fallback_ids_[b] = model->TokenToId(name).value_or(-1);
  }

  const std::string merges_path = jf::Path(path, "merges");
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json* merges = &empty;
  if (json.contains("merges") && !json["merges"].is_null()) {
    ASSIGN_OR_RETURN(merges, jf::Array(json, "merges", path));
  }
  model->merges_.reserve(merges->size());
  std::string left;
  std::string right;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string entry_path = jf::Index(merges_path, rank);
    RETURN_IF_ERROR(ParseMergeEntry((*merges)[rank], entry_path, &left, &right));
    const auto left_id = model->TokenToId(left);
    const auto right_id = model->TokenToId(right);
    // With a continuing-subword prefix the right token carries it, the merged token does not.
    std::string_view right_body = right;
    if (!model->continuing_subword_prefix_.empty() &&
        right_body.starts_with(model->continuing_subword_prefix_)) {
      right_body.remove_prefix(model->continuing_subword_prefix_.size());
    }
    const std::string merged = StrCat(left, right_body);
    const auto new_id = model->TokenToId(merged);
    const std::string* missing = !left_id    ? &left
                                 : !right_id ? &right
                                 : !new_id   ? &merged
                                             : nullptr;
    if (missing != nullptr) {
      return InvalidArgumentError(
          StrCat(entry_path, ": token '", *missing, "' is not in ", vocab_path));
    }
    model->merges_.emplace(PairKey(*left_id, *right_id),
                           Merge{static_cast<int32_t>(rank), *new_id});
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  bool previous_unk = false;
  std::string affixed;
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = utf8::CharLength(word, pos);
    std::string_view symbol = word.substr(pos, length);
    const bool first = pos == 0;
    pos += length;
    const bool last = pos == word.size();
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      affixed.clear();
      if (!first) affixed.append(continuing_subword_prefix_);
      affixed.append(symbol);
      if (last) affixed.append(end_of_word_suffix_);
      symbol = affixed;
    }
    if (const auto id = TokenToId(symbol)) {
      symbols->push_back(*id);
      previous_unk = false;
      continue;
    }
    if (byte_fallback_) {
      const std::string_view bytes = word.substr(pos - length, length);
      const bool all_bytes = std::all_of(bytes.begin(), bytes.end(), [this](char c) {
        return byte_fallback_ids_[static_cast<uint8_t>(c)] >= 0;
      });
      if (all_bytes) {
        for (char c : bytes) symbols->push_back(byte_fallback_ids_[static_cast<uint8_t>(c)]);
        previous_unk = false;
        continue;
      }
    }
    // Without an unk token Hugging Face drops the character; we do the same.
    if (unk_id_.has_value() && !(fuse_unk_ && previous_unk)) symbols->push_back(*unk_id_);
    previous_unk = unk_id_.has_value();
  }
}

void BpeModel::MergeSymbols(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& ids = *symbols;
  const auto n = static_cast<int32_t>(ids.size());
  if (n < 2 || merges_.empty()) return;

  // Symbols form a doubly linked list over `ids`; a merge rewrites the left symbol and unlinks the
  // right one. Candidates are validated when popped, so stale ones are simply skipped.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left_id;
    int32_t right_id;
    int32_t new_id;
  };
  const auto lower_priority = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<int32_t> prev(n);
  std::vector<int32_t> next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::vector<Candidate> heap;
  const auto add_candidate = [&](int32_t pos) {
    const int32_t right = next[pos];
    if (right < 0) return;
    const auto it = merges_.find(PairKey(ids[pos], ids[right]));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, ids[pos], ids[right], it->second.new_id});
    std::push_heap(heap.begin(), heap.end(), lower_priority);
  };
  for (int32_t i = 0; i + 1 < n; ++i) add_candidate(i);

  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), lower_priority);
    const Candidate c = heap.back();
    heap.pop_back();
    if (!alive[c.pos] || ids[c.pos] != c.left_id) continue;
    const int32_t right = next[c.pos];
    if (right < 0 || ids[right] != c.right_id) continue;
    ids[c.pos] = c.new_id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    if (prev[c.pos] >= 0) add_candidate(prev[c.pos]);
    add_candidate(c.pos);
  }
  int32_t out = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  InitialSymbols(word, &symbols);
  MergeSymbols(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(word, std::move(symbols));
  }
}

}  // namespace specula
