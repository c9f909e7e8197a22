#include "common/tokenizer/post_processor.h"

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/tokenizer/json_fields.h"

namespace specula {
namespace {

namespace jf = json_fields;

// A single-sequence template: fixed ids before and after the sequence.
class TemplatePostProcessor : public PostProcessor {
 public:
  TemplatePostProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void Process(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), before_.begin(), before_.end());
    ids->insert(ids->end(), after_.begin(), after_.end());
  }
  std::optional<int32_t> LeadingId() const override {
    if (before_.empty()) return std::nullopt;
    return before_.front();
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

// ByteLevel as a post-processor only trims offsets, which Specula does not track.
class IdentityPostProcessor : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*) const override {}
  std::optional<int32_t> LeadingId() const override { return std::nullopt; }
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->Process(ids);
  }
  std::optional<int32_t> LeadingId() const override {
    // The last step that prepends something decides what comes first.
    std::optional<int32_t> leading;
    for (const auto& step : steps_) {
      if (const auto id = step->LeadingId()) leading = id;
    }
    return leading;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

StatusOr<std::unique_ptr<PostProcessor>> ParseTemplate(const nlohmann::json& json,
                                                       std::string_view path) {
  ASSIGN_OR_RETURN(const nlohmann::json* special_tokens, jf::Object(json, "special_tokens", path));
  ASSIGN_OR_RETURN(const nlohmann::json* single, jf::Array(json, "single", path));
  std::vector<int32_t> before;
  std::vector<int32_t> after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const std::string item_path = jf::Index(jf::Path(path, "single"), i);
    const nlohmann::json& item = (*single)[i];
    if (item.contains("Sequence")) {
      if (seen_sequence) {
        return InvalidArgumentError(StrCat(item_path, ": a single template has one sequence"));
      }
      seen_sequence = true;
      continue;
    }
    ASSIGN_OR_RETURN(const nlohmann::json* piece, jf::Object(item, "SpecialToken", item_path));
    const std::string piece_path = jf::Path(item_path, "SpecialToken");
    ASSIGN_OR_RETURN(std::string name, jf::String(*piece, "id", piece_path));
    const std::string tokens_path = jf::Path(path, "special_tokens");
    if (!special_tokens->contains(name)) {
      return InvalidArgumentError(
          StrCat(jf::Path(piece_path, "id"), " '", name, "' is not in ", tokens_path));
    }
    const std::string entry_path = StrCat(tokens_path, "['", name, "']");
    ASSIGN_OR_RETURN(const nlohmann::json* ids,
                     jf::Array((*special_tokens)[name], "ids", entry_path));
    for (const nlohmann::json& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return InvalidArgumentError(
            StrCat(jf::Path(entry_path, "ids"), " must hold non-negative integer ids"));
      }
      (seen_sequence ? after : before).push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  if (!seen_sequence) {
    return InvalidArgumentError(StrCat(jf::Path(path, "single"), " has no Sequence entry"));
  }
  return std::unique_ptr<PostProcessor>(
      new TemplatePostProcessor(std::move(before), std::move(after)));
}

// "cls": ["<s>", 0] style entries of Bert/RobertaProcessing.
StatusOr<int32_t> ParseTokenPair(const nlohmann::json& json, std::string_view key,
                                 std::string_view path) {
  ASSIGN_OR_RETURN(const nlohmann::json* pair, jf::Array(json, key, path));
  if (pair->size() != 2 || !(*pair)[1].is_number_integer() || (*pair)[1].get<int64_t>() < 0) {
    return InvalidArgumentError(
        StrCat(jf::Path(path, key), " must be a [token, id] pair with a non-negative id"));
  }
  return static_cast<int32_t>((*pair)[1].get<int64_t>());
}

}  // namespace

StatusOr<std::unique_ptr<PostProcessor>> ParsePostProcessor(const nlohmann::json& json,
                                                            std::string_view path) {
  if (json.is_null()) return std::unique_ptr<PostProcessor>();
  ASSIGN_OR_RETURN(std::string type, jf::Type(json, path));
  if (type == "TemplateProcessing") return ParseTemplate(json, path);
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new IdentityPostProcessor());
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    ASSIGN_OR_RETURN(int32_t cls, ParseTokenPair(json, "cls", path));
    ASSIGN_OR_RETURN(int32_t sep, ParseTokenPair(json, "sep", path));
    return std::unique_ptr<PostProcessor>(new TemplatePostProcessor({cls}, {sep}));
  }
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const nlohmann::json* items, jf::Array(json, "processors", path));
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string item_path = jf::Index(jf::Path(path, "processors"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<PostProcessor> step,
                       ParsePostProcessor((*items)[i], item_path));
      if (step == nullptr) return InvalidArgumentError(StrCat(item_path, " must not be null"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(steps)));
  }
  return jf::UnsupportedType(path, type);
}

}  // namespace specula
