// The Beagle network (paper Eq. 1-2) as LibTorch modules, shared by serving (BeagleDrafter: a
// paged cache of true-state keys/values plus per-node drafted states) and training
// (BeagleTrainer: dense [B, T] batches with block masks and autograd). Include only from .cc
// files: this header pulls in <torch/torch.h>.
//
//   query  i: e_i = E[t_i] (the target's embedding, frozen); q_i = RoPE_i(W_Q RMSNorm_q(e_i))
//   key    j: s_j = the target's top hidden state at j (true) or the drafter's output h_j
//              (drafted); k_j = RoPE_j(W_K RMSNorm_s(s_j)), v_j = W_V RMSNorm_s(s_j)
//   y_i = e_i + W_O CrossAttn(q_i; k_j, v_j for the visible j < i)
//   h_i = y_i + SwiGLU(RMSNorm_m(y_i))
//   logits_i = lm_head(h_i)   (the target's lm_head, frozen; no final norm, as in the paper)
//
// h_i is trained to regress the target's top hidden state at i (the EAGLE "vloss"), so a drafted
// h_i can stand in for a true state as a key. Choices the paper leaves open, and why:
//   - Norms: RMSNorm (the target's eps) on the query embeddings, on the key/value states (true
//     states are already normed by the target's final norm but drafted ones are not, so the same
//     norm makes both look alike) and pre-MLP. No final norm: the paper applies e^{-1} directly.
//   - RoPE: the target's RoPE on queries (position i) and keys (position j), so attention sees the
//     relative distance i - j >= 1, like the target's own attention.
//   - GQA: the target's heads / kv heads / head_dim by default (fewer kv heads = a smaller cache).
//   - Embedding and lm_head: the target's, shared (not copied, not saved) and frozen.
//
// Parameter names (checkpoint keys): query_norm.weight, state_norm.weight,
// {q,k,v,o}_proj.weight, mlp_norm.weight, mlp.{gate,up,down}_proj.weight.
#pragma once

#include <torch/torch.h>

#include <utility>

#include "common/drafters/beagle/beagle_config.h"
#include "common/model/draft_head.h"
#include "common/model/transformer.h"

namespace specula {

class BeagleImpl : public torch::nn::Module {
 public:
  BeagleImpl(const BeagleConfig& config, const ModelConfig& target);

  // The target's embedding [V, d] and lm_head [V, d] weights: shared (not copied), frozen.
  void SetTargetWeights(const torch::Tensor& embedding, const torch::Tensor& lm_head);

  struct QueryStates {
    torch::Tensor residual;  // [N, d] e(t), the block's residual input
    torch::Tensor q;         // [N, H, dh], RoPE applied
  };
  // tokens, positions [N] int64.
  QueryStates Query(const torch::Tensor& tokens, const torch::Tensor& positions);
  // states [N, d] (true or drafted), positions [N] -> keys (RoPE applied) and values [N, Hkv, dh].
  std::pair<torch::Tensor, torch::Tensor> KeysValues(const torch::Tensor& states,
                                                     const torch::Tensor& positions);
  // residual [..., d], attention output [..., H * dh] -> h [..., d].
  torch::Tensor Output(const torch::Tensor& residual, const torch::Tensor& attn);
  // h [..., d] -> logits [..., V].
  torch::Tensor Logits(const torch::Tensor& h);
  // Serving: the head projects onto `tokens` only (a draft vocabulary, common/drafters/
  // draft_vocab.h); -inf logits elsewhere. Call after moving the module to its device and dtype.
  void RestrictHead(const std::vector<int32_t>& tokens) { head_.Restrict(tokens); }
  // Tokens the head can rank (V, or the draft vocabulary's size).
  int64_t head_size() const { return head_.size(); }

  // Fresh init: normal(0, 0.02) matrices (o_proj, down_proj scaled by 1/sqrt(2): two residual
  // branches), unit norms.
  void InitWeights(uint64_t seed);

  const BeagleConfig& config() const { return config_; }
  // The geometry of its attention and MLP as a decoder layer's (CpuForward's config).
  const ModelConfig& layer_config() const { return layer_config_; }
  const torch::Tensor& embedding() const { return embedding_; }
  const DraftHead& head() const { return head_; }
  // [positions, head_dim] cos/sin rows of `positions` [N] int64, on the weights' device and dtype.
  std::pair<torch::Tensor, torch::Tensor> RopeFor(const torch::Tensor& positions);

  RMSNorm query_norm{nullptr}, state_norm{nullptr}, mlp_norm{nullptr};
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  Mlp mlp{nullptr};

 private:
  BeagleConfig config_;
  ModelConfig layer_config_;
  torch::Tensor inv_freq_;  // [head_dim / 2] float32; not a buffer (not saved)
  torch::Tensor embedding_;
  DraftHead head_;  // the target's lm_head, optionally cut to a draft vocabulary
};
TORCH_MODULE(Beagle);

// Beagle's cross attention over two key sets, softmax (float32) over their union:
//   q [B, F, H, dh] against shared keys/values [B, T, Hkv, dh] under `mask` [B, F, T] (bool), and
//   optionally per-row keys/values [B, F, D, Hkv, dh] under `row_mask` [B, F, D] (each query row
//   its own drafted ancestors, in serving). Grouped-query: head h uses kv head h / (H / Hkv).
// -> [B, F, H * dh] in q's dtype. A row with no visible key outputs 0 (no NaN).
torch::Tensor BeagleCrossAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& mask,
                                   const torch::Tensor& row_k = {}, const torch::Tensor& row_v = {},
                                   const torch::Tensor& row_mask = {});

// Writes a drafter checkpoint: dir/config.json (kind "beagle") and dir/model.safetensors.
Status SaveBeagleDir(BeagleImpl& model, const std::string& dir);

// Reads a checkpoint written by SaveBeagleDir for `target`. NOT_FOUND without config.json or
// weights; INVALID_ARGUMENT for another kind, another target, or a missing / misshaped tensor.
// CPU, float32, eval mode, no target weights set.
StatusOr<std::shared_ptr<BeagleImpl>> LoadBeagleDir(const std::string& dir,
                                                    const ModelConfig& target);

}  // namespace specula
