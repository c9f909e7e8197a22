#include "common/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/utf8.h"
#include "common/util/mapped_file.h"

namespace specula {
namespace {

namespace jf = json_fields;

const nlohmann::json& MemberOrNull(const nlohmann::json& object, const char* key) {
  static const nlohmann::json* const null_json = new nlohmann::json();
  const auto it = object.find(key);
  return it == object.end() ? *null_json : *it;
}

StatusOr<std::unique_ptr<BpeModel>> ParseModel(const nlohmann::json& root) {
  ASSIGN_OR_RETURN(const nlohmann::json* model, jf::Object(root, "model", ""));
  // Files from before the "type" tag existed are recognised by their BPE fields.
  std::string type = model->contains("merges") ? "BPE" : "";
  ASSIGN_OR_RETURN(type, jf::StringOr(*model, "type", "model", type));
  if (type.empty()) return InvalidArgumentError("model.type is missing");
  if (type != "BPE") return jf::UnsupportedType("model", type);
  return BpeModel::FromJson(*model, "model");
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json,
                                                         std::string_view source_name) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(StrCat(source_name, ": malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return InvalidArgumentError(
        StrCat(source_name, ": top level must be a JSON object, got ", root.type_name()));
  }
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  const auto parse = [&]() -> Status {
    ASSIGN_OR_RETURN(tokenizer->model_, ParseModel(root));
    ASSIGN_OR_RETURN(AddedVocabulary added,
                     AddedVocabulary::FromJson(MemberOrNull(root, "added_tokens"), "added_tokens"));
    tokenizer->added_ = std::make_unique<AddedVocabulary>(std::move(added));
    ASSIGN_OR_RETURN(tokenizer->normalizer_,
                     ParseNormalizer(MemberOrNull(root, "normalizer"), "normalizer"));
    ASSIGN_OR_RETURN(tokenizer->pre_tokenizer_,
                     ParsePreTokenizer(MemberOrNull(root, "pre_tokenizer"), "pre_tokenizer"));
    ASSIGN_OR_RETURN(tokenizer->post_processor_,
                     ParsePostProcessor(MemberOrNull(root, "post_processor"), "post_processor"));
    ASSIGN_OR_RETURN(tokenizer->decoder_, ParseDecoder(MemberOrNull(root, "decoder"), "decoder"));
    return OkStatus();
  };
  if (Status status = parse(); !status.ok()) return status.WithContext(source_name);
  tokenizer->IndexIds();
  return tokenizer;
}

void Tokenizer::IndexIds() {
  int32_t size = model_->vocab_size();
  for (const AddedToken& token : added_->tokens()) size = std::max(size, token.id + 1);
  id_to_token_.assign(size, "");
  id_kind_.assign(size, IdKind::kNone);
  for (int32_t id = 0; id < model_->vocab_size(); ++id) {
    if (const std::string* token = model_->IdToToken(id)) {
      id_to_token_[id] = *token;
      id_kind_[id] = IdKind::kNormal;
    }
  }
  for (const AddedToken& token : added_->tokens()) {
    id_to_token_[token.id] = token.content;
    id_kind_[token.id] = token.special ? IdKind::kSpecial : IdKind::kNormal;
  }
  if (post_processor_ != nullptr) bos_id_ = post_processor_->LeadingId();
  for (const char* name : {"<|begin_of_text|>", "<s>", "<bos>"}) {
    if (!bos_id_.has_value()) bos_id_ = TokenToId(name);
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedVocabulary::Segment> raw_segments;
  std::vector<AddedVocabulary::Segment> normalized_segments;
  std::vector<PreToken> pieces;
  added_->Split(text, /*normalized=*/false, &raw_segments);
  for (const auto& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const std::string_view raw_text = text.substr(raw.begin, raw.end - raw.begin);
    const std::string normalized =
        normalizer_ != nullptr ? normalizer_->Normalize(raw_text) : std::string(raw_text);
    normalized_segments.clear();
    added_->Split(normalized, /*normalized=*/true, &normalized_segments);
    for (const auto& segment : normalized_segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      pieces.clear();
      pieces.push_back({normalized.substr(segment.begin, segment.end - segment.begin),
                        raw.begin == 0 && segment.begin == 0});
      if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&pieces);
      for (const PreToken& piece : pieces) model_->Encode(piece.text, &ids);
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

StatusOr<std::string> Tokenizer::DecodeBytes(const std::vector<int32_t>& ids,
                                             bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || id_kind_[id] == IdKind::kNone) {
      return InvalidArgumentError(StrCat("token id ", id, " (at position ", i,
                                         ") is not in the vocabulary of size ", vocab_size()));
    }
    if (skip_special_tokens && id_kind_[id] == IdKind::kSpecial) continue;
    tokens.push_back(id_to_token_[id]);
  }
  if (decoder_ != nullptr) {
    decoder_->DecodeChain(&tokens);
    std::string out;
    for (const std::string& token : tokens) out.append(token);
    return out;
  }
  // Without a decoder Hugging Face joins the token strings with spaces.
  std::string out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) out.push_back(' ');
    out.append(tokens[i]);
  }
  return out;
}

StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids,
                                        bool skip_special_tokens) const {
  ASSIGN_OR_RETURN(std::string bytes, DecodeBytes(ids, skip_special_tokens));
  return utf8::ToValid(bytes);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* added = added_->FindByContent(token)) return added->id;
  return model_->TokenToId(token);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return id_to_token_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_kind_[id] == IdKind::kSpecial;
}

}  // namespace specula
