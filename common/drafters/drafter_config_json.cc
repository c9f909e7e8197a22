#include "common/drafters/drafter_config_json.h"

namespace specula {

using nlohmann::json;

DrafterTarget DrafterTarget::Of(const ModelConfig& target) {
  return {.model = "",
          .vocab_size = target.vocab_size,
          .hidden_size = target.hidden_size,
          .num_hidden_layers = target.num_hidden_layers};
}

json DrafterTarget::ToJson() const {
  return {{"model", model},
          {"vocab_size", vocab_size},
          {"hidden_size", hidden_size},
          {"num_hidden_layers", num_hidden_layers}};
}

StatusOr<DrafterTarget> DrafterTarget::FromJson(const json& j, std::string_view src) {
  auto target = j.find("target");
  if (target == j.end() || !target->is_object()) {
    return InvalidArgumentError(StrCat(src, ": missing object field 'target'"));
  }
  DrafterTarget t;
  const std::string tsrc = StrCat(src, ": target");
  if (auto m = target->find("model"); m != target->end() && m->is_string()) {
    t.model = m->get<std::string>();
  }
  RETURN_IF_ERROR(ReadJsonInt(*target, "vocab_size", &t.vocab_size, tsrc));
  RETURN_IF_ERROR(ReadJsonInt(*target, "hidden_size", &t.hidden_size, tsrc));
  RETURN_IF_ERROR(ReadJsonInt(*target, "num_hidden_layers", &t.num_hidden_layers, tsrc));
  return t;
}

Status DrafterTarget::Validate(std::string_view src) const {
  RETURN_IF_ERROR(CheckPositive(src, "target.vocab_size", vocab_size));
  RETURN_IF_ERROR(CheckPositive(src, "target.hidden_size", hidden_size));
  return CheckPositive(src, "target.num_hidden_layers", num_hidden_layers);
}

Status DrafterTarget::Check(const ModelConfig& target, std::string_view drafter) const {
  auto differs = [&](const char* what, int64_t mine, int64_t theirs) {
    return InvalidArgumentError(StrCat(drafter, " drafter was trained for a target with ", what,
                                       " ", mine, " (", model.empty() ? "?" : model,
                                       ") but the target has ", theirs));
  };
  if (target.vocab_size != vocab_size) return differs("vocab_size", vocab_size, target.vocab_size);
  if (target.hidden_size != hidden_size) {
    return differs("hidden_size", hidden_size, target.hidden_size);
  }
  if (target.num_hidden_layers != num_hidden_layers) {
    return differs("num_hidden_layers", num_hidden_layers, target.num_hidden_layers);
  }
  return OkStatus();
}

StatusOr<json> ParseDrafterConfig(std::string_view text, std::string_view src,
                                  std::string_view kind) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgumentError(StrCat(src, ": not a valid JSON object"));
  }
  auto k = j.find("kind");
  if (k == j.end() || !k->is_string()) {
    return InvalidArgumentError(
        StrCat(src, ": missing field 'kind' (expected \"", kind, "\"): not a drafter checkpoint"));
  }
  if (k->get<std::string>() != kind) {
    return InvalidArgumentError(
        StrCat(src, ": kind is \"", k->get<std::string>(), "\", expected \"", kind, "\""));
  }
  return j;
}

Status ReadJsonInt(const json& j, const char* key, int64_t* out, std::string_view src) {
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

Status ReadOptionalJsonBool(const json& j, const char* key, bool* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end()) return OkStatus();
  if (!it->is_boolean()) {
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be a boolean"));
  }
  *out = it->get<bool>();
  return OkStatus();
}

Status ReadOptionalJsonNumber(const json& j, const char* key, double* out, std::string_view src) {
  auto it = j.find(key);
  if (it == j.end()) return OkStatus();
  if (!it->is_number()) {
    return InvalidArgumentError(StrCat(src, ": field '", key, "' must be a number"));
  }
  *out = it->get<double>();
  return OkStatus();
}

Status DrafterLayerGeometry::Validate(std::string_view src) const {
  RETURN_IF_ERROR(CheckPositive(src, "num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(CheckPositive(src, "num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(CheckPositive(src, "head_dim", head_dim));
  RETURN_IF_ERROR(CheckPositive(src, "intermediate_size", intermediate_size));
  if (num_attention_heads % num_key_value_heads != 0) {
    return InvalidArgumentError(StrCat(src, ": num_attention_heads (", num_attention_heads,
                                       ") must be a multiple of num_key_value_heads (",
                                       num_key_value_heads, ")"));
  }
  if (head_dim % 2 != 0) {
    return InvalidArgumentError(StrCat(src, ": head_dim must be even for RoPE, got ", head_dim));
  }
  if (!(rms_norm_eps > 0)) {
    return InvalidArgumentError(StrCat(src, ": 'rms_norm_eps' must be positive"));
  }
  return OkStatus();
}

ModelConfig DrafterLayerGeometry::LayerConfig(const ModelConfig& target) const {
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

Status CheckPositive(std::string_view src, const char* name, int64_t v) {
  if (v <= 0) return InvalidArgumentError(StrCat(src, ": '", name, "' must be positive, got ", v));
  return OkStatus();
}

}  // namespace specula
