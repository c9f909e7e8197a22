// ParallelSpec drafter hyperparameters and checkpoint config (config.json next to
// model.safetensors). Torch-free.
//
// ParallelSpec drafts k + 1 tokens with one forward of one decoder layer: the row of the last
// committed position predicts depth 1 and k trainable [MASK] rows appended after it predict depths
// 2..k+1 (see parallelspec_layout.h for the rows and who sees whom). It is tied to one target: the
// layer has the target's geometry and RoPE, the target's embedding and lm_head are shared and
// frozen (never saved with the drafter), and with `use_target_features` (the paper's EAGLE
// integration) every real row fuses the target's hidden state of `feature_layer` with the next
// token's embedding. Without it (the Medusa integration) rows are token embeddings only and no
// hidden state travels to the drafter.
//
// config.json:
//   {"kind": "parallelspec", "target": {"model": "models/pyllama-6m", "vocab_size": 4096,
//    "hidden_size": 256, "num_hidden_layers": 6}, "num_mask_tokens": 4,
//    "use_target_features": true, "feature_layer": 6, "num_attention_heads": 8,
//    "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 768, "rms_norm_eps": 1e-5}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/drafters/drafter_config_json.h"
#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

inline constexpr char kParallelSpecKind[] = "parallelspec";

struct ParallelSpecConfig {
  DrafterTarget target;
  int64_t num_mask_tokens = 4;  // k: [MASK]_1..[MASK]_k, depths 2..k+1
  bool use_target_features = true;
  // The target's hidden state the real rows fuse: 0 = embeddings, i = output of layer i, L =
  // after the final norm (the default: the top state, as Beagle reads).
  int64_t feature_layer = 0;
  // The decoder layer's geometry (default: the target's).
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;

  // The target's geometry, feature_layer L, `k` masks.
  static ParallelSpecConfig ForTarget(const ModelConfig& target, int64_t k = 4);

  static StatusOr<ParallelSpecConfig> FromJson(std::string_view json, std::string_view source_name);
  static StatusOr<ParallelSpecConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // INVALID_ARGUMENT naming the field: sizes not positive, heads that do not divide, odd
  // head_dim, a feature layer outside [0, L].
  Status Validate(std::string_view source_name) const;
  // INVALID_ARGUMENT naming what differs when the drafter was not trained for `target`.
  Status CheckTarget(const ModelConfig& target) const {
    return this->target.Check(target, "ParallelSpec");
  }

  // The decoder layer's config: the target's (RoPE, eps, context) with this geometry.
  ModelConfig LayerConfig(const ModelConfig& target) const;
  DrafterLayerGeometry geometry() const;

  // Parameters of the drafter (the target's shared embedding and lm_head excluded).
  int64_t parameters() const;
};

}  // namespace specula
