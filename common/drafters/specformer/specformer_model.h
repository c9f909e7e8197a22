// The SpecFormer network (paper Eq. 8-10) as LibTorch modules, shared by serving
// (SpecFormerDrafter: packed rows, paged KV cache of the context attention) and training
// (SpecFormerTrainer: dense [B, T] batches with autograd). Include only from .cc files: this header
// pulls in <torch/torch.h>.
//
//   hidden_states[k]  [N, d] for each hooked target layer (+ with pending_token: the target's
//   embedding of each row's next token, one more slice)
//     -> grouped RMSNorm (one weight per slice) -> concat [N, K*d] -> downsampler -> [N, d]
//     -> context causal attention, pre-norm residual: c = x + Attn(RMSNorm(x))   (own KV cache)
//     -> positional FFN: W_P RMSNorm(c) + b_P  [N, l_d * d] -> [N, l_d, d]  (no activation)
//     -> draft block over the l_d slots (bidirectional by default, causal as an option):
//          s = s + Attn(RMSNorm(s)); s = s + SwiGLU(RMSNorm(s))
//     -> the target's final RMSNorm + lm_head (frozen, not parameters of this module)
//   Slot j of row t predicts the token at position t + 2 + j.
//
// Parameter names (checkpoint keys): hook_norms.{k}.weight, downsampler.weight,
// context_norm.weight, context_attn.{q,k,v,o}_proj.weight, positional_norm.weight,
// positional_ffn.{weight,bias}, draft_attn_norm.weight, draft_attn.{q,k,v,o}_proj.weight,
// draft_mlp_norm.weight, draft_mlp.{gate,up,down}_proj.weight.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "common/drafters/specformer/specformer_config.h"
#include "common/model/draft_head.h"
#include "common/model/paged_attention_layout.h"
#include "common/model/transformer.h"

namespace specula {

class SpecFormerImpl : public torch::nn::Module {
 public:
  // `target` supplies the attention geometry defaults, RoPE and context length.
  SpecFormerImpl(const SpecFormerConfig& config, const ModelConfig& target);

  // The target's embedding [V, d] (read only with pending_token), final norm weight [d] and
  // lm_head weight [V, d]; shared (not copied), frozen.
  void SetTargetWeights(const torch::Tensor& embedding, const torch::Tensor& norm_weight,
                        const torch::Tensor& lm_head_weight, double norm_eps);

  // hidden: one [N, d] per hooked layer (config order); next_tokens [N] int64, row r's token at
  // r + 1 (used, and required, only with pending_token) -> [N, d] downsampled.
  torch::Tensor Hook(const std::vector<torch::Tensor>& hidden, const torch::Tensor& next_tokens);
  // x [N, d] -> c [N, d]. `in` lays the rows out (dense causal for training, paged for serving
  // with `kv` the drafter's one-layer cache).
  torch::Tensor Context(const torch::Tensor& x, const AttentionInputs& in, LayerKvCache* kv);
  // c [M, d] -> slot states [M, n, d] (before the target's final norm) of the first n slots:
  // n = l_d by default. With causal slot attention a slot never sees a later one, so serving
  // computes only the depths a step drafts (n = min(slots, l_d)); bidirectional slots all see each
  // other, so every slot runs and the first n are returned.
  torch::Tensor Slots(const torch::Tensor& c, int64_t slots = -1);
  // states [..., d] -> logits [..., V] through the target's final norm + lm_head.
  torch::Tensor Logits(const torch::Tensor& states);
  // Serving: the head projects onto `tokens` only (a draft vocabulary, common/drafters/
  // draft_vocab.h); -inf logits elsewhere. Call after moving the module to its device and dtype.
  void RestrictHead(const std::vector<int32_t>& tokens) { head_.Restrict(tokens); }

  // Serving: fuses the q/k/v and gate/up matmuls of its attentions and MLP (after the module is
  // placed on its device and dtype).
  void FuseForServing();
  // Tokens the head can rank (V, or the draft vocabulary's size).
  int64_t head_size() const { return head_.size(); }

  // Dense causal layout of the context attention for [B, T] rows (positions 0..T-1 per row).
  AttentionInputs DenseContextInputs(int64_t batch, int64_t seq_len);
  // RoPE cos/sin for `positions` [N] (int64) in the module's dtype and device.
  std::pair<torch::Tensor, torch::Tensor> RopeFor(const torch::Tensor& positions);

  // Fresh init: normal(0, 0.02) matrices (residual projections scaled by 1/sqrt(2 * 2) as there
  // are two residual layers), unit norms, zero biases.
  void InitWeights(uint64_t seed);

  const SpecFormerConfig& config() const { return config_; }
  const ModelConfig& layer_config() const { return layer_config_; }
  // The target's weights SetTargetWeights shared, and the head (SpecFormerCpuForward reads them).
  const torch::Tensor& target_embedding() const { return embedding_; }
  const torch::Tensor& head_norm_weight() const { return head_norm_weight_; }
  double head_norm_eps() const { return head_norm_eps_; }
  const DraftHead& head() const { return head_; }

  torch::nn::ModuleList hook_norms{nullptr};
  torch::nn::Linear downsampler{nullptr};
  RMSNorm context_norm{nullptr};
  SelfAttention context_attn{nullptr};
  RMSNorm positional_norm{nullptr};
  torch::nn::Linear positional_ffn{nullptr};
  RMSNorm draft_attn_norm{nullptr};
  SelfAttention draft_attn{nullptr};
  RMSNorm draft_mlp_norm{nullptr};
  Mlp draft_mlp{nullptr};

 private:
  SpecFormerConfig config_;
  ModelConfig layer_config_;
  torch::Tensor inv_freq_;  // [head_dim / 2] float32; not a buffer (not saved)
  torch::Tensor embedding_, head_norm_weight_;
  DraftHead head_;  // the target's lm_head, optionally cut to a draft vocabulary
  double head_norm_eps_ = 1e-6;
};
TORCH_MODULE(SpecFormer);

// Writes a drafter checkpoint: dir/config.json (the SpecFormerConfig, kind "specformer") and
// dir/model.safetensors (this module's parameters; the target's head is not included).
// Serving's layout of the draft block: each of `sequences` sequences' `slots` slots as one block
// (block m of a scratch cache holds sequence m's), a causal chain over an empty prefix or one
// bidirectional block. The layout points into `tables` (one block table per sequence), which must
// outlive it.
PagedAttentionLayout SlotLayout(int64_t sequences, int64_t slots, bool causal,
                                std::vector<std::vector<int32_t>>& tables);

Status SaveSpecFormerDir(SpecFormerImpl& model, const std::string& dir);

// Reads a checkpoint written by SaveSpecFormerDir for `target`. NOT_FOUND without config.json or
// weights; INVALID_ARGUMENT for another kind, a config trained for a different target (vocabulary,
// hidden size or layer count), or a missing / misshaped tensor. The module is on the CPU in
// float32, in eval mode, with no target head set.
StatusOr<std::shared_ptr<SpecFormerImpl>> LoadSpecFormerDir(const std::string& dir,
                                                            const ModelConfig& target);

}  // namespace specula
