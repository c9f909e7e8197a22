#include "common/drafters/beagle/beagle_config.h"

#include <nlohmann/json.hpp>

#include "common/util/mapped_file.h"

namespace specula {

using nlohmann::json;

BeagleConfig BeagleConfig::ForTarget(const ModelConfig& target) {
  BeagleConfig c;
  c.target = DrafterTarget::Of(target);
  c.num_attention_heads = target.num_attention_heads;
  c.num_key_value_heads = target.num_key_value_heads;
  c.head_dim = target.head_dim;
  c.intermediate_size = target.intermediate_size;
  c.rms_norm_eps = target.rms_norm_eps;
  return c;
}

StatusOr<BeagleConfig> BeagleConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<BeagleConfig> BeagleConfig::FromJson(std::string_view text, std::string_view src) {
  ASSIGN_OR_RETURN(json j, ParseDrafterConfig(text, src, kBeagleKind));
  BeagleConfig c;
  ASSIGN_OR_RETURN(c.target, DrafterTarget::FromJson(j, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_attention_heads", &c.num_attention_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_key_value_heads", &c.num_key_value_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "head_dim", &c.head_dim, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "intermediate_size", &c.intermediate_size, src));
  RETURN_IF_ERROR(ReadOptionalJsonNumber(j, "rms_norm_eps", &c.rms_norm_eps, src));
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::string BeagleConfig::ToJson() const {
  json j;
  j["kind"] = kBeagleKind;
  j["target"] = target.ToJson();
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["rms_norm_eps"] = rms_norm_eps;
  j["parameters"] = parameters();
  return j.dump(2) + "\n";
}

Status BeagleConfig::Validate(std::string_view src) const {
  RETURN_IF_ERROR(target.Validate(src));
  return geometry().Validate(src);
}

DrafterLayerGeometry BeagleConfig::geometry() const {
  return {.num_attention_heads = num_attention_heads,
          .num_key_value_heads = num_key_value_heads,
          .head_dim = head_dim,
          .intermediate_size = intermediate_size,
          .rms_norm_eps = rms_norm_eps};
}

ModelConfig BeagleConfig::LayerConfig(const ModelConfig& target) const {
  return geometry().LayerConfig(target);
}

int64_t BeagleConfig::parameters() const {
  const int64_t d = target.hidden_size;
  const int64_t q = d * num_attention_heads * head_dim, kv = d * num_key_value_heads * head_dim;
  const int64_t norms = 3 * d;  // query, state and MLP norms
  return norms + 2 * q + 2 * kv + 3 * d * intermediate_size;
}

}  // namespace specula
