// Llama-family decoder-only transformer (Llama, Qwen2, Qwen3, Mistral) as LibTorch modules.
//
// The same modules serve (ModelRunner: paged KV cache, token trees) and train (dense causal batches
// with autograd), so there is no train/serve skew. Parameter names equal Hugging Face's
// (model.layers.0.self_attn.q_proj.weight, ...), so named_parameters() maps 1:1 to checkpoints.
// Include only from .cc files: this header pulls in <torch/torch.h>.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "common/model/attention_inputs.h"
#include "common/model/model_config.h"

namespace specula {

// RMSNorm as HF computes it (float32 statistics, cast back, then the weight) in five ops (six in
// half precision) instead of six (eight): ||x|| in float32 straight from x, then
// rsqrt(||x||^2 / d + eps) as one addcmul and one rsqrt on the [..., 1] column. The inference
// path where each op is a launch (a GPU). eps: a float32 scalar tensor on x's device.
torch::Tensor RmsNormFewOps(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& eps);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);  // [..., dim] -> [..., dim]
  torch::Tensor weight;

 private:
  double eps_;
  torch::Tensor eps_tensor_;  // eps as a float32 scalar on the weight's device (inference path)
};
TORCH_MODULE(RMSNorm);

class SelfAttentionImpl : public torch::nn::Module {
 public:
  explicit SelfAttentionImpl(const ModelConfig& config);
  // x [N, d] -> [N, d]. With `kv` the new keys/values are written to the cache (paged mode).
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in, LayerKvCache* kv);
  // The attention output before o_proj, [N, heads * head_dim].
  torch::Tensor Attend(const torch::Tensor& x, const AttentionInputs& in, LayerKvCache* kv);

  // Serving: q/k/v become views of one [q+k+v, d] weight so that a forward runs one matmul. The
  // parameters keep their names and stay trainable (they share the fused storage).
  void FuseProjections();
  // Whether q/k/v are still views of the fused weight (moving the module un-fuses it), and that
  // weight [q+k+v, d] and bias (undefined without biases).
  bool fused() const;
  const torch::Tensor& qkv_weight() const { return qkv_weight_; }
  const torch::Tensor& qkv_bias() const { return qkv_bias_; }

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3 only

 private:
  // q, k, v [N, heads, head_dim] of x: one matmul when fused (views of its output), else three.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> Project(const torch::Tensor& x);

  int64_t num_heads_, num_kv_heads_, head_dim_;
  torch::Tensor qkv_weight_, qkv_bias_;  // fused storage (undefined until FuseProjections)
};
TORCH_MODULE(SelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x);     // SwiGLU: down(silu(gate(x)) * up(x))
  torch::Tensor Activation(const torch::Tensor& x);  // silu(gate(x)) * up(x)
  // Serving: gate and up become views of one [2f, d] weight (one matmul per forward).
  void FuseProjections();
  // Whether gate and up are still views of the fused [2f, d] weight, and that weight.
  bool fused() const;
  const torch::Tensor& gate_up_weight() const { return gate_up_weight_; }
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  torch::Tensor gate_up_weight_;
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  explicit DecoderLayerImpl(const ModelConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in, LayerKvCache* kv);
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  SelfAttention self_attn{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// "model." in HF names.
class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& config);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(Transformer);

struct TransformerOutput {
  torch::Tensor last_hidden;                 // [N, d] after the final norm
  std::vector<torch::Tensor> hidden_states;  // one [N, d] per requested layer index
};

class CausalLMImpl : public torch::nn::Module {
 public:
  explicit CausalLMImpl(const ModelConfig& config);

  // tokens [N] int64 -> final normed hidden [N, d] and the requested hidden states:
  // index 0 = embeddings, i = output of layer i, L = after the final norm (HF's hidden_states).
  // kv_caches: one per layer in paged mode, empty in dense mode.
  TransformerOutput forward(const torch::Tensor& tokens, const AttentionInputs& in,
                            std::vector<LayerKvCache>* kv_caches,
                            const std::vector<int64_t>& hidden_layers = {});
  // hidden [..., d] -> logits [..., vocab] (tied embeddings use embed_tokens.weight).
  torch::Tensor Logits(const torch::Tensor& hidden);
  const torch::Tensor& lm_head_weight() const;

  // Dense causal inputs for a [B, T] batch laid out row-major (training, reference checks).
  AttentionInputs DenseCausalInputs(int64_t batch, int64_t seq_len, const torch::Tensor& positions);
  // Init as HF does for fresh models: normal(0, 0.02) weights, zero biases, unit norms.
  // HF-style init (normal 0.02, norms 1, biases 0). depth_scaled: GPT-2's 1/sqrt(2L) on the
  // residual projections (o_proj, down_proj).
  void InitWeights(uint64_t seed, bool depth_scaled = true);

  // Fuses each layer's q/k/v and gate/up projections (see SelfAttentionImpl::FuseProjections).
  // Call after the module is on its device and dtype: moving it again un-fuses (safely: the fused
  // path is used only while the parameters still share its storage).
  void FuseForServing();

  const ModelConfig& config() const { return config_; }
  Transformer model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings
  torch::Tensor inv_freq;              // [head_dim / 2] float32; deliberately not a buffer

 private:
  ModelConfig config_;
};
TORCH_MODULE(CausalLM);

// [B, Tq, nh, hd] queries against [B, Tk, nkv, hd] keys/values under mask [B, 1, 1, Tq, Tk]
// (grouped-query: query head h uses kv head h / (nh / nkv)); softmax in float32. -> [B, Tq, nh, hd]
torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask);

// x [..., in] -> x W^T + bias (+ *residual): without autograd, SmallMatmulCpu for a few float32
// CPU rows, else one (add)mm with the residual folded in; with autograd or other shapes,
// F::linear (+ residual).
torch::Tensor ServingLinear(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias, const torch::Tensor* residual = nullptr);

torch::ScalarType ParseTorchDtype(const std::string& name, bool* ok);

}  // namespace specula
