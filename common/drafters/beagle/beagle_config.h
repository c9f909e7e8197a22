// Beagle drafter hyperparameters and checkpoint config (config.json next to model.safetensors).
// Torch-free.
//
// Beagle (Budget EAGLE) is one cross-attention decoder block on top of a frozen target: queries
// come from the target's token embeddings, keys/values from "higher-level states" (the target's
// top hidden states for committed positions, the drafter's own outputs for drafted ones), and the
// target's embedding and lm_head are shared, frozen and never saved with the drafter. The config
// records the target it was trained for so that loading it against another is a clear error.
//
// config.json:
//   {"kind": "beagle", "target": {"model": "models/pyllama-6m", "vocab_size": 4096,
//    "hidden_size": 256, "num_hidden_layers": 6}, "num_attention_heads": 8,
//    "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 768, "rms_norm_eps": 1e-5}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/drafters/drafter_config_json.h"
#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

inline constexpr char kBeagleKind[] = "beagle";

struct BeagleConfig {
  DrafterTarget target;
  // Cross-attention geometry (default: the target's, so GQA follows the target) and the MLP's
  // SwiGLU size.
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;

  // The target's geometry.
  static BeagleConfig ForTarget(const ModelConfig& target);

  static StatusOr<BeagleConfig> FromJson(std::string_view json, std::string_view source_name);
  static StatusOr<BeagleConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // INVALID_ARGUMENT naming the field: sizes not positive, heads that do not divide, odd head_dim.
  Status Validate(std::string_view source_name) const;
  // INVALID_ARGUMENT naming what differs when the drafter was not trained for `target`.
  Status CheckTarget(const ModelConfig& target) const {
    return this->target.Check(target, "Beagle");
  }

  // The attention/MLP config of the drafter's block: the target's (RoPE, eps, context) with this
  // config's heads and intermediate size, no biases, no q/k norm.
  ModelConfig LayerConfig(const ModelConfig& target) const;
  DrafterLayerGeometry geometry() const;

  // Parameters of the drafter (the target's shared embedding and lm_head excluded).
  int64_t parameters() const;
};

}  // namespace specula
