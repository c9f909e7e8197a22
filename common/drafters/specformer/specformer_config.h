// SpecFormer drafter hyperparameters and checkpoint config (config.json next to
// model.safetensors). Torch-free.
//
// The drafter is tied to one target: it reads the target's hidden states (hooked layers), uses
// the target's attention geometry and RoPE for its own attention layers, and the target's final
// norm + lm_head (shared, frozen, never saved with the drafter) for its logits. The config records
// the target's vocabulary, hidden size and layer count so that loading against a different target
// is a clear error instead of garbage drafts.
//
// config.json:
//   {"kind": "specformer", "target": {"model": "models/pyllama-6m", "vocab_size": 4096,
//    "hidden_size": 256, "num_hidden_layers": 6}, "hidden_layers": [0, 3, 5, 6],
//    "draft_len": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
//    "intermediate_size": 768, "causal_draft": false, "pending_token": false, "rms_norm_eps": 1e-5}
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/drafters/drafter_config_json.h"
#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

inline constexpr char kSpecFormerKind[] = "specformer";

struct SpecFormerConfig {
  // The target this drafter was trained on.
  std::string target_model;  // informational (the directory it was trained with)
  int64_t target_vocab_size = 0;
  int64_t target_hidden_size = 0;
  int64_t target_num_hidden_layers = 0;

  // Hooked target layers: 0 = embeddings, i = output of layer i, L = after the final norm.
  std::vector<int64_t> hidden_layers;
  int64_t draft_len = 8;  // l_d: slots, slot j at position t predicts token t + 2 + j
  // Context and draft attention geometry (default: the target's).
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;  // the draft block's SwiGLU
  bool causal_draft = false;      // slot attention: bidirectional (paper) or causal (reference)
  // Row t also reads the embedding of token t + 1 (the target's, frozen): at drafting time the
  // pending token the target just committed, which the paper's drafter never sees (its slot 0
  // must guess it). The EAGLE-style drafters (Beagle, ParallelSpec) all read it. An extension,
  // off by default (the paper's network); absent in config.json = false.
  bool pending_token = false;
  double rms_norm_eps = 1e-6;

  // Defaults for `target`: hooks {0, L/2, L-1, L}, its heads, head_dim and intermediate size.
  static SpecFormerConfig ForTarget(const ModelConfig& target, int64_t draft_len = 8);

  static StatusOr<SpecFormerConfig> FromJson(std::string_view json, std::string_view source_name);
  static StatusOr<SpecFormerConfig> FromFile(const std::string& path);
  std::string ToJson() const;

  // INVALID_ARGUMENT naming the field: sizes not positive, heads that do not divide, hooks outside
  // [0, L], an empty hook list.
  Status Validate(std::string_view source_name) const;
  // INVALID_ARGUMENT naming what differs (vocabulary, hidden size, layer count) when the drafter
  // was not trained for `target`.
  Status CheckTarget(const ModelConfig& target) const;
  DrafterTarget target() const;

  // The attention/MLP config of the drafter's own layers: the target's (RoPE, eps, context) with
  // this config's heads and intermediate size, no biases, no q/k norm.
  ModelConfig LayerConfig(const ModelConfig& target) const;
  DrafterLayerGeometry geometry() const;
  // Slices the downsampler concatenates: one per hooked layer, plus the pending token's embedding.
  int64_t hook_inputs() const;

  // Parameters of the drafter (without the target's shared norm + lm_head): shared across slots
  // (m_s: hook norms, downsampler, context attention, draft block) and per slot (m_p: one slot's
  // share of the positional FFN).
  int64_t shared_parameters() const;
  int64_t per_slot_parameters() const;
};

}  // namespace specula
