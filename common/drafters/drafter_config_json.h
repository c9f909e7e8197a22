// Shared pieces of a trained drafter's config.json (SpecFormer, Beagle): the "kind" check, the
// "target" block that ties the drafter to one target model, and typed field readers whose errors
// name the file and the field. Torch-free.
//
//   {"kind": "<kind>", "target": {"model": "models/pyllama-6m", "vocab_size": 4096,
//    "hidden_size": 256, "num_hidden_layers": 6}, ...}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

// The target a drafter was trained for. A drafter reads the target's hidden states and shares its
// embedding / lm_head, so loading it against another target must fail clearly.
struct DrafterTarget {
  std::string model;  // informational (the directory it was trained with)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;

  static DrafterTarget Of(const ModelConfig& target);
  nlohmann::json ToJson() const;
  // Reads j["target"]; INVALID_ARGUMENT naming the missing or mistyped field.
  static StatusOr<DrafterTarget> FromJson(const nlohmann::json& j, std::string_view src);
  // INVALID_ARGUMENT when a size is not positive.
  Status Validate(std::string_view src) const;
  // INVALID_ARGUMENT naming what differs (vocabulary, hidden size, layer count); `drafter` names
  // the drafter kind in the message ("SpecFormer", "Beagle").
  Status Check(const ModelConfig& target, std::string_view drafter) const;
};

// Parses `text` as a drafter config of `kind`: INVALID_ARGUMENT for invalid JSON, a missing
// "kind" (not a drafter checkpoint) or another kind.
StatusOr<nlohmann::json> ParseDrafterConfig(std::string_view text, std::string_view src,
                                            std::string_view kind);

// Required integer / optional bool and number fields; INVALID_ARGUMENT naming `src` and the key.
Status ReadJsonInt(const nlohmann::json& j, const char* key, int64_t* out, std::string_view src);
Status ReadOptionalJsonBool(const nlohmann::json& j, const char* key, bool* out,
                            std::string_view src);
Status ReadOptionalJsonNumber(const nlohmann::json& j, const char* key, double* out,
                              std::string_view src);

// The attention / MLP geometry of a drafter's own layers.
struct DrafterLayerGeometry {
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;

  // INVALID_ARGUMENT naming the field: sizes not positive, heads that do not divide, an odd
  // head_dim (RoPE), a non-positive eps.
  Status Validate(std::string_view src) const;
  // The target's config (RoPE, context) with this geometry, no biases, no q/k norm, no window.
  ModelConfig LayerConfig(const ModelConfig& target) const;
};

// INVALID_ARGUMENT "<src>: '<name>' must be positive, got v" when v <= 0.
Status CheckPositive(std::string_view src, const char* name, int64_t v);

}  // namespace specula
