// The pattern of Split pre-tokenizers and Replace normalizers/decoders: {"String": "literal"} or
// {"Regex": "..."} in tokenizer.json.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/tokenizer/regex.h"
#include "common/util/status.h"

namespace specula {

class Pattern {
 public:
  // `path` names the pattern field in errors ("pre_tokenizer.pattern").
  static StatusOr<Pattern> FromJson(const nlohmann::json& json, std::string_view path);
  static Pattern Literal(std::string literal);
  static StatusOr<Pattern> FromRegex(std::string_view regex);

  // Appends the [begin, end) byte ranges of successive non-overlapping, non-empty matches.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* matches) const;

  // `text` with every match replaced by `content`.
  std::string ReplaceAll(std::string_view text, std::string_view content) const;

 private:
  Pattern(std::string literal, std::optional<Regex> regex)
      : literal_(std::move(literal)), regex_(std::move(regex)) {}

  std::string literal_;  // used when regex_ is empty
  std::optional<Regex> regex_;
};

}  // namespace specula
