// SpecDec Spec-Drafter hyperparameters and checkpoint config (config.json next to
// model.safetensors). Torch-free.
//
// A decoder-only adaptation of Xia et al.'s deep-shallow drafter (see specdec_model.h): a deep
// causal context encoder over the committed tokens and a shallow mask decoder over `num_slots`
// query slots. Token-only: it reads no hidden states of the target and has its own embedding and
// (tied) head, so it runs in another process with only tokens on the wire. The "target" block
// ties it to the target it was distilled from (vocabulary, and the target's shape as a check).
//
// config.json:
//   {"kind": "specdec", "target": {"model": "models/pyllama-6m", "vocab_size": 4096,
//    "hidden_size": 256, "num_hidden_layers": 6}, "hidden_size": 128, "encoder_layers": 4,
//    "decoder_layers": 2, "num_slots": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
//    "head_dim": 32, "intermediate_size": 384, "rms_norm_eps": 1e-5}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/drafters/drafter_config_json.h"
#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

inline constexpr char kSpecDecKind[] = "specdec";

struct SpecDecConfig {
  DrafterTarget target;  // the target this drafter was distilled from

  int64_t hidden_size = 128;   // the drafter's own width (embedding, encoder, decoder)
  int64_t encoder_layers = 4;  // L_e: causal layers over the committed tokens (deep)
  int64_t decoder_layers = 2;  // L_d: layers over the query slots (shallow)
  int64_t num_slots = 8;       // k: slots a pass drafts (slot j predicts position P + 1 + j)
  // Attention / SwiGLU geometry of every layer (encoder and decoder).
  DrafterLayerGeometry geometry{.num_attention_heads = 4,
                                .num_key_value_heads = 2,
                                .head_dim = 32,
                                .intermediate_size = 384,
                                .rms_norm_eps = 1e-5};

  // Defaults above for `target` (the target block filled in).
  static SpecDecConfig ForTarget(const ModelConfig& target);

  static StatusOr<SpecDecConfig> FromJson(std::string_view json, std::string_view source_name);
  static StatusOr<SpecDecConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // INVALID_ARGUMENT naming the field: sizes not positive, heads that do not divide, an odd
  // head_dim.
  Status Validate(std::string_view source_name) const;
  // INVALID_ARGUMENT naming what differs when the drafter was not distilled from `target`.
  Status CheckTarget(const ModelConfig& target) const;

  // The config of the drafter's own layers: the target's RoPE and context length with this
  // width, geometry and vocabulary, `layers` layers, tied embeddings, no biases.
  ModelConfig LayerConfig(const ModelConfig& target_config, int64_t layers) const;
  // Parameters of the whole drafter (embedding counted once: the head is tied).
  int64_t parameters() const;
};

}  // namespace specula
