#include "common/drafters/draft_vocab.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/util/mapped_file.h"

namespace specula {

using json = nlohmann::json;

DraftVocab DraftVocab::FromCounts(const std::vector<int64_t>& counts, int64_t size,
                                  std::string source) {
  DraftVocab v;
  v.vocab_size = static_cast<int64_t>(counts.size());
  v.source = std::move(source);
  std::vector<int32_t> order(counts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return counts[a] > counts[b]; });
  int64_t inside = 0;
  for (int32_t id : order) {
    if (static_cast<int64_t>(v.tokens.size()) >= size || counts[id] <= 0) break;
    v.tokens.push_back(id);
    inside += counts[id];
  }
  v.counted_tokens = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  v.coverage = v.counted_tokens > 0 ? static_cast<double>(inside) / v.counted_tokens : 0.0;
  return v;
}

StatusOr<DraftVocab> DraftVocab::FromJson(std::string_view text, std::string_view src) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(StrCat(src, ": not a JSON object"));
  }
  DraftVocab v;
  auto size = j.find("vocab_size");
  if (size == j.end() || !size->is_number_integer()) {
    return InvalidArgumentError(StrCat(src, ": missing integer field 'vocab_size'"));
  }
  v.vocab_size = size->get<int64_t>();
  auto tokens = j.find("tokens");
  if (tokens == j.end() || !tokens->is_array()) {
    return InvalidArgumentError(StrCat(src, ": missing array field 'tokens'"));
  }
  for (const auto& t : *tokens) {
    if (!t.is_number_integer()) {
      return InvalidArgumentError(StrCat(src, ": 'tokens' must hold integers"));
    }
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= v.vocab_size) {
      return InvalidArgumentError(
          StrCat(src, ": token ", id, " outside [0, ", v.vocab_size, ") ('vocab_size')"));
    }
    v.tokens.push_back(static_cast<int32_t>(id));
  }
  if (auto c = j.find("coverage"); c != j.end() && c->is_number()) v.coverage = c->get<double>();
  if (auto s = j.find("source"); s != j.end() && s->is_string()) v.source = s->get<std::string>();
  if (auto n = j.find("counted_tokens"); n != j.end() && n->is_number_integer()) {
    v.counted_tokens = n->get<int64_t>();
  }
  RETURN_IF_ERROR(v.Validate(src));
  return v;
}

StatusOr<DraftVocab> DraftVocab::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

std::string DraftVocab::ToJson() const {
  json j;
  j["vocab_size"] = vocab_size;
  j["coverage"] = coverage;
  j["source"] = source;
  j["counted_tokens"] = counted_tokens;
  j["tokens"] = tokens;
  return j.dump() + "\n";
}

Status DraftVocab::Validate(std::string_view src) const {
  if (vocab_size <= 0) return InvalidArgumentError(StrCat(src, ": 'vocab_size' must be positive"));
  if (tokens.empty()) return InvalidArgumentError(StrCat(src, ": 'tokens' is empty"));
  std::vector<bool> seen(vocab_size, false);
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgumentError(StrCat(src, ": token ", id, " outside [0, ", vocab_size, ")"));
    }
    if (seen[id]) return InvalidArgumentError(StrCat(src, ": token ", id, " is listed twice"));
    seen[id] = true;
  }
  return OkStatus();
}

Status DraftVocab::CheckTarget(int64_t target_vocab, std::string_view src) const {
  if (vocab_size != target_vocab) {
    return InvalidArgumentError(StrCat(src, ": made for a vocabulary of ", vocab_size,
                                       " tokens, the target has ", target_vocab));
  }
  return OkStatus();
}

}  // namespace specula
