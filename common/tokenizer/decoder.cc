#include "common/tokenizer/decoder.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/utf8.h"

namespace specula {
namespace {

namespace jf = json_fields;

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

// Maps byte-level characters back to bytes and fuses everything into one string. A token with a
// character outside the alphabet (an added token containing a space, say) is kept as it is.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      if (!byte_level::Decode(token, &bytes)) bytes.append(token);
    }
    tokens->assign(1, std::move(bytes));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = pattern_.ReplaceAll(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Turns each <0xNN> token into the byte it names.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    bool previous_was_byte = false;
    for (std::string& token : *tokens) {
      const int byte = ParseByteToken(token);
      if (byte < 0) {
        out.push_back(std::move(token));
        previous_was_byte = false;
        continue;
      }
      // Consecutive bytes share one string so that later per-token steps see whole characters.
      if (!previous_was_byte) out.emplace_back();
      out.back().push_back(static_cast<char>(byte));
      previous_was_byte = true;
    }
    *tokens = std::move(out);
  }

 private:
  static int ParseByteToken(std::string_view token) {
    if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
    int value = 0;
    for (char c : token.substr(3, 2)) {
      int digit;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else {
        return -1;
      }
      value = value * 16 + digit;
    }
    return value;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string fused;
    for (const std::string& token : *tokens) fused.append(token);
    tokens->assign(1, std::move(fused));
  }
};

// Removes up to `start` leading and `stop` trailing copies of `content` (one character) from every
// token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::string_view rest = token;
      for (size_t i = 0; i < start_ && rest.starts_with(content_); ++i) {
        rest.remove_prefix(content_.size());
      }
      for (size_t i = 0; i < stop_ && rest.ends_with(content_); ++i) {
        rest.remove_suffix(content_.size());
      }
      token = std::string(rest);
    }
  }

 private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

// Turns the replacement character back into spaces; in the first token it is dropped instead
// (it was prepended by the pre-tokenizer) unless the prepend scheme is "never".
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(Pattern::Literal(replacement)), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      token = replacement_.ReplaceAll(token, i == 0 && strip_first_ ? "" : " ");
    }
  }

 private:
  Pattern replacement_;
  bool strip_first_;
};

StatusOr<std::unique_ptr<Decoder>> ParseMetaspace(const nlohmann::json& json,
                                                  std::string_view path) {
  ASSIGN_OR_RETURN(std::string replacement, jf::StringOr(json, "replacement", path, "\u2581"));
  if (replacement.empty()) {
    return InvalidArgumentError(StrCat(jf::Path(path, "replacement"), " must not be empty"));
  }
  ASSIGN_OR_RETURN(bool add_prefix_space, jf::BoolOr(json, "add_prefix_space", path, true));
  ASSIGN_OR_RETURN(std::string scheme, jf::StringOr(json, "prepend_scheme", path,
                                                    add_prefix_space ? "always" : "never"));
  if (scheme != "first" && scheme != "always" && scheme != "never") {
    return InvalidArgumentError(StrCat(jf::Path(path, "prepend_scheme"), " '", scheme,
                                       "' is not one of first, always, never"));
  }
  return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(replacement), scheme != "never"));
}

StatusOr<std::unique_ptr<Decoder>> ParseStrip(const nlohmann::json& json, std::string_view path) {
  ASSIGN_OR_RETURN(std::string content, jf::String(json, "content", path));
  size_t length = 0;
  if (content.empty() || utf8::DecodeAt(content, 0, &length) < 0 || length != content.size()) {
    return InvalidArgumentError(StrCat(jf::Path(path, "content"), " must be one character"));
  }
  ASSIGN_OR_RETURN(int64_t start, jf::IntOr(json, "start", path, 0));
  ASSIGN_OR_RETURN(int64_t stop, jf::IntOr(json, "stop", path, 0));
  if (start < 0 || stop < 0) {
    return InvalidArgumentError(StrCat(path, ".start and .stop must not be negative"));
  }
  return std::unique_ptr<Decoder>(new StripDecoder(std::move(content), start, stop));
}

}  // namespace

StatusOr<std::unique_ptr<Decoder>> ParseDecoder(const nlohmann::json& json, std::string_view path) {
  if (json.is_null()) return std::unique_ptr<Decoder>();
  ASSIGN_OR_RETURN(std::string type, jf::Type(json, path));
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(const nlohmann::json* items, jf::Array(json, "decoders", path));
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < items->size(); ++i) {
      const std::string item_path = jf::Index(jf::Path(path, "decoders"), i);
      ASSIGN_OR_RETURN(std::unique_ptr<Decoder> step, ParseDecoder((*items)[i], item_path));
      if (step == nullptr) return InvalidArgumentError(StrCat(item_path, " must not be null"));
      steps.push_back(std::move(step));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Replace") {
    ASSIGN_OR_RETURN(const nlohmann::json* pattern_json, jf::Required(json, "pattern", path));
    ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(*pattern_json, jf::Path(path, "pattern")));
    ASSIGN_OR_RETURN(std::string content, jf::String(json, "content", path));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(pattern), std::move(content)));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") return ParseStrip(json, path);
  if (type == "Metaspace") return ParseMetaspace(json, path);
  return jf::UnsupportedType(path, type);
}

}  // namespace specula
