// The ParallelSpec network as LibTorch modules, shared by serving (ParallelSpecDrafter: packed
// rows over a one-layer paged cache, the target's serving kernels) and training
// (ParallelSpecTrainer: group-wise batches with autograd). Include only from .cc files: this header
// pulls in <torch/torch.h>.
//
//   real row:  x = fusion([f ; e(token)])   (use_target_features; else x = e(token))
//   mask i:    x = fusion([0 ; M_i])        (else x = M_i)
//   h = DecoderLayer(x)                     (the target's geometry and RoPE; pre-norm attention
//                                            and SwiGLU with residuals, as the target's layers)
//   logits = lm_head(h)                     (the target's, frozen; no final norm: h regresses the
//                                            target's feature, which is already normed at layer L)
// Rows, positions and visibility: parallelspec_layout.h.
//
// Parameter names (checkpoint keys): fusion.{weight,bias} (with features), mask_embeddings
// [k, d], layer.input_layernorm.weight, layer.self_attn.{q,k,v,o}_proj.weight,
// layer.post_attention_layernorm.weight, layer.mlp.{gate,up,down}_proj.weight.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "common/drafters/parallelspec/parallelspec_config.h"
#include "common/model/draft_head.h"
#include "common/model/transformer.h"

namespace specula {

class ParallelSpecImpl : public torch::nn::Module {
 public:
  ParallelSpecImpl(const ParallelSpecConfig& config, const ModelConfig& target);

  // The target's embedding [V, d] and lm_head [V, d] weights: shared (not copied), frozen.
  void SetTargetWeights(const torch::Tensor& embedding, const torch::Tensor& lm_head);

  // Real rows: features [N, d] (ignored without use_target_features), tokens [N] int64 (the
  // token after each feature's position) -> x [N, d].
  torch::Tensor RealInputs(const torch::Tensor& features, const torch::Tensor& tokens);
  // The k mask rows' inputs [k, d] (the same for every group).
  torch::Tensor MaskInputs();
  // x [N, d] -> h [N, d] through the decoder layer; `in` paged over `kv` (serving) or dense.
  torch::Tensor Layer(const torch::Tensor& x, const AttentionInputs& in, LayerKvCache* kv);
  // h [..., d] -> logits [..., V].
  torch::Tensor Logits(const torch::Tensor& h);
  // Serving: the head projects onto `tokens` only (a draft vocabulary, common/drafters/
  // draft_vocab.h); -inf logits elsewhere. Call after moving the module to its device and dtype.
  void RestrictHead(const std::vector<int32_t>& tokens) { head_.Restrict(tokens); }
  // Tokens the head can rank (V, or the draft vocabulary's size).
  int64_t head_size() const { return head_.size(); }
  // RoPE cos/sin for `positions` [N] (int64) in the module's dtype and device.
  std::pair<torch::Tensor, torch::Tensor> RopeFor(const torch::Tensor& positions);

  // Group-wise forward (training; parallelspec_layout.h) without the dense mask: real rows
  // x_real [B, T, d] at positions 0..T-1 attend causally to each other (shared keys); the masks
  // of the groups `groups` [B, G] (int64 r; rows with `group_valid` [B, G] false are padding)
  // attend to the real rows 0..r (shared keys) and to their own group's masks (per-row keys).
  struct GroupOutput {
    torch::Tensor real;   // [B, T, d]
    torch::Tensor masks;  // [B, G, k, d]
  };
  GroupOutput GroupForward(const torch::Tensor& x_real, const torch::Tensor& groups,
                           const torch::Tensor& group_valid);

  // Serving: fuses the layer's q/k/v and gate/up matmuls (after the module is placed).
  void FuseForServing();

  // Fresh init: normal(0, 0.02) matrices (o_proj, down_proj scaled by 1/sqrt(2): two residual
  // branches), unit norms, zero biases, mask embeddings normal(0, 0.02).
  void InitWeights(uint64_t seed);

  const ParallelSpecConfig& config() const { return config_; }
  // The decoder layer's geometry (the target's RoPE, eps and context), the shared embedding and
  // the head (CpuForward reads them).
  const ModelConfig& layer_config() const { return layer_config_; }
  const torch::Tensor& target_embedding() const { return embedding_; }
  const DraftHead& head() const { return head_; }

  torch::nn::Linear fusion{nullptr};  // null without use_target_features
  torch::Tensor mask_embeddings;      // [k, d]
  DecoderLayer layer{nullptr};

 private:
  ParallelSpecConfig config_;
  ModelConfig layer_config_;
  torch::Tensor inv_freq_;  // [head_dim / 2] float32; not a buffer (not saved)
  torch::Tensor embedding_;
  DraftHead head_;  // the target's lm_head, optionally cut to a draft vocabulary
};
TORCH_MODULE(ParallelSpec);

// Writes a drafter checkpoint: dir/config.json (kind "parallelspec") and dir/model.safetensors
// (this module's parameters; the target's embedding and lm_head are not included).
Status SaveParallelSpecDir(ParallelSpecImpl& model, const std::string& dir);

// Reads a checkpoint written by SaveParallelSpecDir for `target`. NOT_FOUND without config.json or
// weights; INVALID_ARGUMENT for another kind, another target, or a missing / misshaped tensor.
// CPU, float32, eval mode, no target weights set.
StatusOr<std::shared_ptr<ParallelSpecImpl>> LoadParallelSpecDir(const std::string& dir,
                                                                const ModelConfig& target);

}  // namespace specula
