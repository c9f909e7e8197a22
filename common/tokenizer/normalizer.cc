#include "common/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/nfc.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string Normalize(std::string_view text) const override {
    std::string out(text);
    for (const auto& step : steps_) out = step->Normalize(out);
    return out;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Prepends to non-empty text only, as Hugging Face does.
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Normalize(std::string_view text) const override {
    if (text.empty()) return "";
    return StrCat(prefix_, text);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string Normalize(std::string_view text) const override {
    return pattern_.ReplaceAll(text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string Normalize(std::string_view text) const override {
    if (right_) text = text.substr(0, utf8::TrailingWhitespaceStart(text));
    if (left_) text.remove_prefix(utf8::LeadingWhitespaceLength(text));
    return std::string(text);
  }

 private:
  bool left_;
  bool right_;
};

class NfcNormalizer : public Normalizer {
 public:
  std::string Normalize(std::string_view text) const override { return ToNfc(text); }
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> ParseNormalizer(const nlohmann::json& json,
                                                      std::string_view path) {
  namespace jf = json_fields;
  if (json.is_null()) return std::unique_ptr<Normalizer>();
  ASSIGN_OR_RETURN(std::string type, jf::Type(json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const nlohmann::json* items, jf::Array(json, "normalizers", path));
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string item_path = jf::Index(jf::Path(path, "normalizers"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> step, ParseNormalizer((*items)[i], item_path));
      if (step == nullptr) return InvalidArgumentError(StrCat(item_path, " must not be null"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, jf::String(json, "prepend", path));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(prefix)));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(const nlohmann::json* pattern_json, jf::Required(json, "pattern", path));
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, jf::Path(path, "pattern")));
    ASSIGN_OR_RETURN(std::string content, jf::String(json, "content", path));
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(std::move(pattern), std::move(content)));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(bool left, jf::BoolOr(json, "strip_left", path, true));
    ASSIGN_OR_RETURN(bool right, jf::BoolOr(json, "strip_right", path, true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new NfcNormalizer());
  return jf::UnsupportedType(path, type);
}

}  // namespace specula
