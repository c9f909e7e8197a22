#include "common/drafters/specformer/specformer_config.h"

#include <nlohmann/json.hpp>

#include "common/drafters/drafter_config_json.h"
#include "common/util/mapped_file.h"

namespace specula {
using nlohmann::json;

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
  ASSIGN_OR_RETURN(json j, ParseDrafterConfig(text, src, kSpecFormerKind));
  SpecFormerConfig c;
  ASSIGN_OR_RETURN(DrafterTarget target, DrafterTarget::FromJson(j, src));
  c.target_model = target.model;
  c.target_vocab_size = target.vocab_size;
  c.target_hidden_size = target.hidden_size;
  c.target_num_hidden_layers = target.num_hidden_layers;
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
  RETURN_IF_ERROR(ReadJsonInt(j, "draft_len", &c.draft_len, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_attention_heads", &c.num_attention_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "num_key_value_heads", &c.num_key_value_heads, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "head_dim", &c.head_dim, src));
  RETURN_IF_ERROR(ReadJsonInt(j, "intermediate_size", &c.intermediate_size, src));
  RETURN_IF_ERROR(ReadOptionalJsonBool(j, "causal_draft", &c.causal_draft, src));
  RETURN_IF_ERROR(ReadOptionalJsonBool(j, "pending_token", &c.pending_token, src));
  RETURN_IF_ERROR(ReadOptionalJsonNumber(j, "rms_norm_eps", &c.rms_norm_eps, src));
  RETURN_IF_ERROR(c.Validate(src));
  return c;
}

std::string SpecFormerConfig::ToJson() const {
  json j;
  j["kind"] = kSpecFormerKind;
  j["target"] = target().ToJson();
  j["hidden_layers"] = hidden_layers;
  j["draft_len"] = draft_len;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["intermediate_size"] = intermediate_size;
  j["causal_draft"] = causal_draft;
  j["pending_token"] = pending_token;
  j["rms_norm_eps"] = rms_norm_eps;
  j["parameters"] = {{"shared", shared_parameters()}, {"per_slot", per_slot_parameters()}};
  return j.dump(2) + "\n";
}

Status SpecFormerConfig::Validate(std::string_view src) const {
  auto positive = [&](const char* name, int64_t v) { return CheckPositive(src, name, v); };
  RETURN_IF_ERROR(target().Validate(src));
  RETURN_IF_ERROR(positive("draft_len", draft_len));
  RETURN_IF_ERROR(geometry().Validate(src));
  if (hidden_layers.empty()) {
    return InvalidArgumentError(StrCat(src, ": 'hidden_layers' is empty"));
  }
  for (int64_t l : hidden_layers) {
    if (l < 0 || l > target_num_hidden_layers) {
      return InvalidArgumentError(StrCat(src, ": hidden layer ", l, " outside [0, ",
                                         target_num_hidden_layers, "] (the target's layers)"));
    }
  }
  return OkStatus();
}

DrafterTarget SpecFormerConfig::target() const {
  return {.model = target_model,
          .vocab_size = target_vocab_size,
          .hidden_size = target_hidden_size,
          .num_hidden_layers = target_num_hidden_layers};
}

Status SpecFormerConfig::CheckTarget(const ModelConfig& target) const {
  return this->target().Check(target, "SpecFormer");
}

ModelConfig SpecFormerConfig::LayerConfig(const ModelConfig& target) const {
  return geometry().LayerConfig(target);
}

DrafterLayerGeometry SpecFormerConfig::geometry() const {
  return {.num_attention_heads = num_attention_heads,
          .num_key_value_heads = num_key_value_heads,
          .head_dim = head_dim,
          .intermediate_size = intermediate_size,
          .rms_norm_eps = rms_norm_eps};
}

int64_t SpecFormerConfig::hook_inputs() const {
  return static_cast<int64_t>(hidden_layers.size()) + (pending_token ? 1 : 0);
}

int64_t SpecFormerConfig::shared_parameters() const {
  const int64_t d = target_hidden_size, hooks = hook_inputs();
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
