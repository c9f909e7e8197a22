#include "common/drafters/specdec/specdec_config.h"

#include <nlohmann/json.hpp>

#include "common/util/mapped_file.h"

namespace specula {
using nlohmann::json;

SpecDecConfig SpecDecConfig::ForTarget(const ModelConfig& target) {
  SpecDecConfig c;
  c.target = DrafterTarget::Of(target);
  c.geometry.rms_norm_eps = target.rms_norm_eps;
  return c;
}

StatusOr<SpecDecConfig> SpecDecConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<SpecDecConfig> SpecDecConfig::FromJson(std::string_view text, std::string_view src) {
  ASSIGN_OR_RETURN(json j, ParseDrafterConfig(text, src, kSpecDecKind));
  SpecDecConfig c;
  ASSIGN_OR_RETURN(c.target, DrafterTarget::FromJson(j, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "hidden_size", &c.hidden_size, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "encoder_layers", &c.encoder_layers, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "decoder_layers", &c.decoder_layers, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_slots", &c.num_slots, src));
  DrafterLayerGeometry& g = c.geometry;
  RETURN_IF_ERROR(ReadJsonInt(j, "num_attention_heads", &g.num_attention_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_key_value_heads", &g.num_key_value_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "head_dim", &g.head_dim, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "intermediate_size", &g.intermediate_size, src));
  RETURN_IF_ERROR(ReadOptionalJsonNumber(j, "rms_norm_eps", &g.rms_norm_eps, src));
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::string SpecDecConfig::ToJson() const {
  json j;
  j["kind"] = kSpecDecKind;
  j["target"] = target.ToJson();
  j["hidden_size"] = hidden_size;
  j["encoder_layers"] = encoder_layers;
  j["decoder_layers"] = decoder_layers;
  j["num_slots"] = num_slots;
  j["num_attention_heads"] = geometry.num_attention_heads;
  j["num_key_value_heads"] = geometry.num_key_value_heads;
  j["head_dim"] = geometry.head_dim;
  j["intermediate_size"] = geometry.intermediate_size;
  j["rms_norm_eps"] = geometry.rms_norm_eps;
  j["parameters"] = parameters();
  return j.dump(2) + "\n";
}

Status SpecDecConfig::Validate(std::string_view src) const {
  RETURN_IF_ERROR(target.Validate(src));
  RETURN_IF_ERROR(CheckPositive(src, "hidden_size", hidden_size));
  RETURN_IF_ERROR(CheckPositive(src, "encoder_layers", encoder_layers));
  RETURN_IF_ERROR(CheckPositive(src, "decoder_layers", decoder_layers));
  RETURN_IF_ERROR(CheckPositive(src, "num_slots", num_slots));
  return geometry.Validate(src);
}

Status SpecDecConfig::CheckTarget(const ModelConfig& target_config) const {
  return target.Check(target_config, "SpecDec");
}

ModelConfig SpecDecConfig::LayerConfig(const ModelConfig& target_config, int64_t layers) const {
  ModelConfig c = geometry.LayerConfig(target_config);
  c.hidden_size = hidden_size;
  c.num_hidden_layers = layers;
  c.vocab_size = target.vocab_size;
  c.tie_word_embeddings = true;
  return c;
}

int64_t SpecDecConfig::parameters() const {
  const int64_t d = hidden_size;
  const DrafterLayerGeometry& g = geometry;
  const int64_t attn =
      d * g.num_attention_heads * g.head_dim * 2 + d * g.num_key_value_heads * g.head_dim * 2;
  const int64_t layer = 2 * d + attn + 3 * d * g.intermediate_size;
  // Embedding (tied head), encoder layers + final norm, decoder layers + final norm, the [MASK]
  // and slot embeddings.
  return target.vocab_size * d + encoder_layers * layer + d + decoder_layers * layer + d + d +
         num_slots * d;
}

}  // namespace specula
