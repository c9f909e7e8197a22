#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/pattern.h"

namespace specula {
namespace {

namespace jf = json_fields;
using Ranges = std::vector<std::pair<size_t, size_t>>;

// Replaces each token by the sub-ranges `split` returns for its text. A sub-piece keeps `at_start`
// only if it begins where its parent began.
template <typename SplitFn>
void SplitEach(std::vector<PreToken>* tokens, const SplitFn& split) {
  std::vector<PreToken> out;
  out.reserve(tokens->size());
  Ranges pieces;
  for (PreToken& token : *tokens) {
    pieces.clear();
    split(token.text, &pieces);
    if (pieces.size() == 1 && pieces[0].first == 0 && pieces[0].second == token.text.size()) {
      out.push_back(std::move(token));
      continue;
    }
    for (const auto& [begin, end] : pieces) {
      out.push_back({token.text.substr(begin, end - begin), token.at_start && begin == 0});
    }
  }
  *tokens = std::move(out);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<PreToken>* tokens) const override {
    for (const auto& step : steps_) step->PreTokenize(tokens);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* tokens) const override {
    Ranges matches;
    SplitEach(tokens, [&](std::string_view text, Ranges* pieces) {
      matches.clear();
      pattern_.FindAll(text, &matches);
      SplitByMatches(text.size(), matches, behavior_, invert_, pieces);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Optionally prefixes a space, optionally splits with the GPT-2 regex, then maps every byte to its
// byte-level character so that BPE sees printable symbols.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> split)
      : add_prefix_space_(add_prefix_space), split_(std::move(split)) {}
  void PreTokenize(std::vector<PreToken>* tokens) const override {
    if (add_prefix_space_) {
      for (PreToken& token : *tokens) {
        if (!token.text.starts_with(' ')) token.text.insert(0, 1, ' ');
      }
    }
    if (split_.has_value()) {
      Ranges matches;
      SplitEach(tokens, [&](std::string_view text, Ranges* pieces) {
        matches.clear();
        split_->FindAll(text, &matches);
        SplitByMatches(text.size(), matches, SplitBehavior::kIsolated, false, pieces);
      });
    }
    for (PreToken& token : *tokens) token.text = byte_level::Encode(token.text);
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> split_;
};

enum class PrependScheme { kFirst, kAlways, kNever };

// SentencePiece-style: spaces become the replacement character ("▁"), which is prepended to the
// text per `prepend_scheme`, and the text is split before each replacement character.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void PreTokenize(std::vector<PreToken>* tokens) const override {
    const Pattern space = Pattern::Literal(" ");
    for (PreToken& token : *tokens) {
      token.text = space.ReplaceAll(token.text, replacement_);
      const bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && token.at_start);
      if (prepend && !token.text.empty() && !token.text.starts_with(replacement_)) {
        token.text.insert(0, replacement_);
      }
    }
    if (!split_) return;
    const Pattern delimiter = Pattern::Literal(replacement_);
    Ranges matches;
    SplitEach(tokens, [&](std::string_view text, Ranges* pieces) {
      matches.clear();
      delimiter.FindAll(text, &matches);
      SplitByMatches(text.size(), matches, SplitBehavior::kMergedWithNext, false, pieces);
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& json, std::string_view path) {
  ASSIGN_OR_RETURN(std::string name, jf::String(json, "behavior", path));
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgumentError(StrCat(jf::Path(path, "behavior"), " '", name,
                                     "' is not one of Removed, Isolated, MergedWithPrevious, "
                                     "MergedWithNext, Contiguous"));
}

StatusOr<std::unique_ptr<PreTokenizer>> ParseMetaspace(const nlohmann::json& json,
                                                       std::string_view path) {
  ASSIGN_OR_RETURN(std::string replacement, jf::StringOr(json, "replacement", path, "\u2581"));
  if (replacement.empty()) {
    return InvalidArgumentError(StrCat(jf::Path(path, "replacement"), " must not be empty"));
  }
  // Files written before prepend_scheme existed carry add_prefix_space instead.
  ASSIGN_OR_RETURN(bool add_prefix_space, jf::BoolOr(json, "add_prefix_space", path, true));
  ASSIGN_OR_RETURN(std::string scheme_name, jf::StringOr(json, "prepend_scheme", path,
                                                         add_prefix_space ? "always" : "never"));
  PrependScheme scheme;
  if (scheme_name == "first") {
    scheme = PrependScheme::kFirst;
  } else if (scheme_name == "always") {
    scheme = PrependScheme::kAlways;
  } else if (scheme_name == "never") {
    scheme = PrependScheme::kNever;
  } else {
    return InvalidArgumentError(StrCat(jf::Path(path, "prepend_scheme"), " '", scheme_name,
                                       "' is not one of first, always, never"));
  }
  ASSIGN_OR_RETURN(bool split, jf::BoolOr(json, "split", path, true));
  return std::unique_ptr<PreTokenizer>(
      new MetaspacePreTokenizer(std::move(replacement), scheme, split));
}

}  // namespace

void SplitByMatches(size_t text_size, const std::vector<std::pair<size_t, size_t>>& matches,
                    SplitBehavior behavior, bool invert,
                    std::vector<std::pair<size_t, size_t>>* pieces) {
  struct Part {
    size_t begin;
    size_t end;
    bool is_match;
  };
  std::vector<Part> parts;
  parts.reserve(matches.size() * 2 + 1);
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    if (last < begin) parts.push_back({last, begin, invert});
    parts.push_back({begin, end, !invert});
    last = end;
  }
  if (last < text_size) parts.push_back({last, text_size, invert});

  // The folds below mirror Hugging Face's SplitDelimiterBehavior exactly, including how runs of
  // consecutive matches are treated.
  std::vector<Part> out;
  out.reserve(parts.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) out.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      out = parts;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().begin = it->begin;
        } else {
          out.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
  }
  for (const Part& p : out) {
    if (p.end > p.begin) pieces->emplace_back(p.begin, p.end);
  }
}

StatusOr<std::unique_ptr<PreTokenizer>> ParsePreTokenizer(const nlohmann::json& json,
                                                          std::string_view path) {
  if (json.is_null()) return std::unique_ptr<PreTokenizer>();
  ASSIGN_OR_RETURN(std::string type, jf::Type(json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const nlohmann::json* items, jf::Array(json, "pretokenizers", path));
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string item_path = jf::Index(jf::Path(path, "pretokenizers"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> step,
                       ParsePreTokenizer((*items)[i], item_path));
      if (step == nullptr) return InvalidArgumentError(StrCat(item_path, " must not be null"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "ByteLevel") {
    ASSIGN_OR_RETURN(bool add_prefix_space, jf::BoolOr(json, "add_prefix_space", path, true));
    ASSIGN_OR_RETURN(bool use_regex, jf::BoolOr(json, "use_regex", path, true));
    std::optional<Regex> split;
    if (use_regex) {
      ASSIGN_OR_RETURN(split, Regex::Compile(kGpt2SplitPattern));
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(add_prefix_space, std::move(split)));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(const nlohmann::json* pattern_json, jf::Required(json, "pattern", path));
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, jf::Path(path, "pattern")));
    ASSIGN_OR_RETURN(SplitBehavior behavior, ParseBehavior(json, path));
    ASSIGN_OR_RETURN(bool invert, jf::BoolOr(json, "invert", path, false));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), behavior, invert));
  }
  if (type == "Metaspace") return ParseMetaspace(json, path);
  if (type == "Digits") {
    // Hugging Face splits on numeric characters: one piece per digit, or per run of digits.
    ASSIGN_OR_RETURN(bool individual, jf::BoolOr(json, "individual_digits", path, false));
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromRegex(individual ? R"(\p{N})" : R"(\p{N}+)"));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(pattern), SplitBehavior::kIsolated, false));
  }
  return jf::UnsupportedType(path, type);
}

}  // namespace specula
