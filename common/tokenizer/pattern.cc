#include "common/tokenizer/pattern.h"

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_fields.h"

namespace specula {

StatusOr<Pattern> Pattern::FromJson(const nlohmann::json& json, std::string_view path) {
  if (!json.is_object() || json.size() != 1) {
    return InvalidArgumentError(
        StrCat(path, " must be an object with one key, \"String\" or \"Regex\""));
  }
  if (json.contains("String")) {
    ASSIGN_OR_RETURN(std::string literal, json_fields::String(json, "String", path));
    return Literal(std::move(literal));
  }
  if (json.contains("Regex")) {
    ASSIGN_OR_RETURN(std::string regex, json_fields::String(json, "Regex", path));
    auto pattern = FromRegex(regex);
    if (!pattern.ok()) return pattern.status().WithContext(json_fields::Path(path, "Regex"));
    return pattern;
  }
  return InvalidArgumentError(
      StrCat(path, " has key '", json.begin().key(), "'; expected \"String\" or \"Regex\""));
}

Pattern Pattern::Literal(std::string literal) { return Pattern(std::move(literal), std::nullopt); }

StatusOr<Pattern> Pattern::FromRegex(std::string_view regex) {
  ASSIGN_OR_RETURN(Regex compiled, Regex::Compile(regex));
  return Pattern("", std::move(compiled));
}

void Pattern::FindAll(std::string_view text,
                      std::vector<std::pair<size_t, size_t>>* matches) const {
  if (regex_.has_value()) {
    regex_->FindAll(text, matches);
    return;
  }
  if (literal_.empty()) return;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size())) {
    matches->emplace_back(pos, pos + literal_.size());
  }
}

std::string Pattern::ReplaceAll(std::string_view text, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  FindAll(text, &matches);
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    out.append(text.substr(last, begin - last));
    out.append(content);
    last = end;
  }
  out.append(text.substr(last));
  return out;
}

}  // namespace specula
