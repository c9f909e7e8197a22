#include "common/drafters/parallelspec/parallelspec_config.h"

#include <nlohmann/json.hpp>

#include "common/util/mapped_file.h"

namespace specula {

using nlohmann::json;

ParallelSpecConfig ParallelSpecConfig::ForTarget(const ModelConfig& target, int64_t k) {
  ParallelSpecConfig c;
  c.target = DrafterTarget::Of(target);
  c.num_mask_tokens = k;
  c.feature_layer = target.num_hidden_layers;
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.intermediate_size = target.intermediate_size;
  c.rms_norm_eps = target.rms_norm_eps;
  return c;
}

StatusOr<ParallelSpecConfig> ParallelSpecConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<ParallelSpecConfig> ParallelSpecConfig::FromJson(std::string_view text,
                                                          std::string_view src) {
  ASSIGN_OR_RETURN(json j, ParseDrafterConfig(text, src, kParallelSpecKind));
  ParallelSpecConfig c;
  ASSIGN_OR_RETURN(c.target, DrafterTarget::FromJson(j, src));
  c.feature_layer = c.target.num_hidden_layers;
  RETURN_IF_ERROR(ReadJsonInt(j, "num_mask_tokens", &c.num_mask_tokens, src));
  RETURN_IF_ERROR(ReadOptionalJsonBool(j, "use_target_features", &c.use_target_features, src));
  if (j.contains("feature_layer")) {
    RETURN_IF_ERROR(ReadJsonInt(j, "feature_layer", &c.feature_layer, src));
  }
  RETURN_IF_ERROR(ReadJsonInt(j, "num_attention_heads", &c.num_attention_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_key_value_heads", &c.num_key_value_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "head_dim", &c.head_dim, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "intermediate_size", &c.intermediate_size, src));
  RETURN_IF_ERROR(ReadOptionalJsonNumber(j, "rms_norm_eps", &c.rms_norm_eps, src));
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::string ParallelSpecConfig::ToJson() const {
  json j;
  j["kind"] = kParallelSpecKind;
  j["target"] = target.ToJson();
  j["num_mask_tokens"] = num_mask_tokens;
  j["use_target_features"] = use_target_features;
  j["feature_layer"] = feature_layer;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["rms_norm_eps"] = rms_norm_eps;
  j["parameters"] = parameters();
  return j.dump(2) + "\n";
}

Status ParallelSpecConfig::Validate(std::string_view src) const {
  RETURN_IF_ERROR(target.Validate(src));
  RETURN_IF_ERROR(CheckPositive(src, "num_mask_tokens", num_mask_tokens));
  if (feature_layer < 0 || feature_layer > target.num_hidden_layers) {
    return InvalidArgumentError(StrCat(src, ": 'feature_layer' ", feature_layer, " outside [0, ",
                                       target.num_hidden_layers, "] (the target's layers)"));
  }
  return geometry().Validate(src);
}

DrafterLayerGeometry ParallelSpecConfig::geometry() const {
  return {.num_attention_heads = num_attention_heads,
          .num_key_value_heads = num_key_value_heads,
          .head_dim = head_dim,
          .intermediate_size = intermediate_size,
          .rms_norm_eps = rms_norm_eps};
}

ModelConfig ParallelSpecConfig::LayerConfig(const ModelConfig& target) const {
  return geometry().LayerConfig(target);
}

int64_t ParallelSpecConfig::parameters() const {
  const int64_t d = target.hidden_size;
  const int64_t q = d * num_attention_heads * head_dim, kv = d * num_key_value_heads * head_dim;
  const int64_t fusion = use_target_features ? 2 * d * d + d : 0;  // Linear(2d -> d, bias)
  const int64_t layer = 2 * d + 2 * q + 2 * kv + 3 * d * intermediate_size;  // norms, attn, MLP
  return fusion + layer + num_mask_tokens * d;
}

}  // namespace specula
