#include "common/drafters/specformer/specformer_config.h"

#include <nlohmann/json.hpp>

#include "common/util/mapped_file.h"

namespace specula {
namespace {

using nlohmann::json;

Status ReadInt(const json& j, const char* key, int64_t* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    return InvalidArgumentError(StrCat(src, ": missing required field '", key, "'"));
  }
  if (!it->is_number_integer()) {
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be an integer"));
  }
  *out = it->get<int64_t>();
  return OkStatus();
}

}  // namespace

SpecFormerConfig SpecFormerConfig::ForTarget(const ModelConfig& target, int64_t draft_len) {
  SpecFormerConfig c;
  c.target_vocab_size = target.vocab_size;
  c.target_hidden_size = target.hidden_size;
  c.target_num_hidden_layers = target.num_hidden_layers;
  const int64_t L = target.num_hidden_layers;
  c.hidden_layers = {0, L / 2, L - 1, L};
  c.draft_len = draft_len;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.intermediate_size = target.intermediate_size;
  c.rms_norm_eps = target.rms_norm_eps;
  return c;
}

StatusOr<SpecFormerConfig> SpecFormerConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<SpecFormerConfig> SpecFormerConfig::FromJson(std::string_view text, std::string_view src) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(StrCat(src, ": not a valid JSON object"));
  }
  auto kind = j.find("kind");
  if (kind == j.end() || !kind->is_string()) {
    return InvalidArgumentError(StrCat(src, ": missing field 'kind' (expected \"", kSpecFormerKind,
                                       "\"): not a drafter checkpoint"));
  }
  if (kind->get<std::string>() != kSpecFormerKind) {
    return InvalidArgumentError(StrCat(src, ": kind is \"", kind->get<std::string>(),
                                       "\", expected \"", kSpecFormerKind, "\""));
  }
  SpecFormerConfig c;
  auto target = j.find("target");
  if (target == j.end() || !target->is_object()) {
    return InvalidArgumentError(StrCat(src, ": missing object field 'target'"));
  }
  const std::string tsrc = StrCat(src, ": target");
  if (auto m = target->find("model"); m != target->end() && m->is_string()) {
    c.target_model = m->get<std::string>();
  }
  RETURN_IF_ERROR(ReadInt(*target, "vocab_size", &c.target_vocab_size, tsrc));
  RETURN_IF_ERROR(ReadInt(*target, "hidden_size", &c.target_hidden_size, tsrc));
  RETURN_IF_ERROR(ReadInt(*target, "num_hidden_layers", &c.target_num_hidden_layers, tsrc));
  auto layers = j.find("hidden_layers");
  if (layers == j.end() || !layers->is_array()) {
    return InvalidArgumentError(StrCat(src, ": missing array field 'hidden_layers'"));
  }
  for (const auto& l : *layers) {
    if (!l.is_number_integer()) {
      return InvalidArgumentError(StrCat(src, ": 'hidden_layers' must hold integers"));
    }
    c.hidden_layers.push_back(l.get<int64_t>());
  }
  RETURN_IF_ERROR(ReadInt(j, "draft_len", &c.draft_len, src));
  RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", &c.num_attention_heads, src));
  RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", &c.num_key_value_heads, src));
  RETURN_IF_ERROR(ReadInt(j, "head_dim", &c.head_dim, src));
  RETURN_IF_ERROR(ReadInt(j, "intermediate_size", &c.intermediate_size, src));
  if (auto it = j.find("causal_draft"); it != j.end()) {
    if (!it->is_boolean()) {
      return InvalidArgumentError(StrCat(src, ": field 'causal_draft' must be a boolean"));
    }
    c.causal_draft = it->get<bool>();
  }
  if (auto it = j.find("rms_norm_eps"); it != j.end()) {
    if (!it->is_number()) {
      return InvalidArgumentError(StrCat(src, ": field 'rms_norm_eps' must be a number"));
    }
    c.rms_norm_eps = it->get<double>();
  }
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::string SpecFormerConfig::ToJson() const {
  json j;
  j["kind"] = kSpecFormerKind;
  j["target"] = {{"model", target_model},
                 {"vocab_size", target_vocab_size},
                 {"hidden_size", target_hidden_size},
                 {"num_hidden_layers", target_num_hidden_layers}};
  j["hidden_layers"] = hidden_layers;
  j["draft_len"] = draft_len;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["causal_draft"] = causal_draft;
  j["rms_norm_eps"] = rms_norm_eps;
  j["parameters"] = {{"shared", shared_parameters()}, {"per_slot", per_slot_parameters()}};
  return j.dump(2) + "\n";
}

Status SpecFormerConfig::Validate(std::string_view src) const {
  auto positive = [&](const char* name, int64_t v) -> Status {
    if (v <= 0)
      return InvalidArgumentError(StrCat(src, ": '", name, "' must be positive, got ", v));
    return OkStatus();
  };
  RETURN_IF_ERROR(positive("target.vocab_size", target_vocab_size));
  RETURN_IF_ERROR(positive("target.hidden_size", target_hidden_size));
  RETURN_IF_ERROR(positive("target.num_hidden_layers", target_num_hidden_layers));
  RETURN_IF_ERROR(positive("draft_len", draft_len));
  RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(positive("head_dim", head_dim));
  RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  if (num_attention_heads % num_key_value_heads != 0) {
    return InvalidArgumentError(StrCat(src, ": num_attention_heads (", num_attention_heads,
                                       ") must be a multiple of num_key_value_heads (",
                                       num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return InvalidArgumentError(StrCat(src, ": head_dim must be even for RoPE, got ", head_dim));
  }
  if (hidden_layers.empty()) {
    return InvalidArgumentError(StrCat(src, ": 'hidden_layers' is empty"));
  }
  for (int64_t l : hidden_layers) {
    if (l < 0 || l > target_num_hidden_layers) {
      return InvalidArgumentError(StrCat(src, ": hidden layer ", l, " outside [0, ",
                                         target_num_hidden_layers, "] (the target's layers)"));
    }
  }
  if (!(rms_norm_eps > 0)) {
    return InvalidArgumentError(StrCat(src, ": 'rms_norm_eps' must be positive"));
  }
  return OkStatus();
}

Status SpecFormerConfig::CheckTarget(const ModelConfig& target) const {
  auto differs = [&](const char* what, int64_t mine, int64_t theirs) {
    return InvalidArgumentError(StrCat("SpecFormer drafter was trained for a target with ", what,
                                       " ", mine, " (", target_model.empty() ? "?" : target_model,
                                       ") but the target has ", theirs));
  };
  if (target.vocab_size != target_vocab_size) {
    return differs("vocab_size", target_vocab_size, target.vocab_size);
  }
  if (target.hidden_size != target_hidden_size) {
    return differs("hidden_size", target_hidden_size, target.hidden_size);
  }
  if (target.num_hidden_layers != target_num_hidden_layers) {
    return differs("num_hidden_layers", target_num_hidden_layers, target.num_hidden_layers);
  }
  return OkStatus();
}

ModelConfig SpecFormerConfig::LayerConfig(const ModelConfig& target) const {
  ModelConfig c = target;
  c.num_attention_heads = num_attention_heads;
  c.num_key_value_heads = num_key_value_heads;
  c.head_dim = head_dim;
  c.intermediate_size = intermediate_size;
  c.rms_norm_eps = rms_norm_eps;
  c.qkv_bias = false;
  c.o_bias = false;
  c.qk_norm = false;
  c.sliding_window.reset();
  return c;
}

int64_t SpecFormerConfig::shared_parameters() const {
  const int64_t d = target_hidden_size, hooks = static_cast<int64_t>(hidden_layers.size());
  const int64_t attn =
      d * num_attention_heads * head_dim * 2 + d * num_key_value_heads * head_dim * 2;
  const int64_t hook = hooks * d + hooks * d * d;  // grouped norm + downsampler
  const int64_t context = d + attn;                // norm + attention
  const int64_t positional = d;                    // the positional FFN's input norm
  const int64_t draft = 2 * d + attn + 3 * d * intermediate_size;
  return hook + context + positional + draft;
}

int64_t SpecFormerConfig::per_slot_parameters() const {
  return target_hidden_size * target_hidden_size + target_hidden_size;
}

}  // namespace specula
