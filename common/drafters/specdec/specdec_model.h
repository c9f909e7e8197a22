// The SpecDec Spec-Drafter as a LibTorch module: a decoder-only adaptation of Xia et al.'s
// deep-shallow non-autoregressive drafter. Include only from .cc files (pulls in <torch/torch.h>).
//
//   context encoder  L_e causal decoder layers (the target's layer code) over the committed
//                    tokens x_0..x_{n-1}, own embedding, final norm: states h [n, d]. Served
//                    incrementally with a paged cache; only committed tokens enter it.
//   mask decoder     L_d decoder layers over k query slots at RoPE positions n..n+k-1, slot j's
//                    input = [MASK] embedding + slot embedding j (training may reveal a gold token:
//                    its token embedding replaces [MASK]). Each layer's attention is one softmax
//                    over the encoder states (cross-attention: the layer's own key/value
//                    projections of its input norm of h, at their positions) and all k slots
//                    (bidirectional self-attention), then SwiGLU. Logits through the tied head.
//
// Slot j predicts the token at position n + j. Serving and training run the same submodules:
// serving through paged attention (DecoderLayer over AddBidirectionalBlock layouts), training
// through dense masked attention (TrainLogits); tests check that both give the same logits.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/drafters/specdec/specdec_config.h"
#include "common/model/attention_inputs.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/util/status.h"

namespace specula {

class SpecDecImpl : public torch::nn::Module {
 public:
  SpecDecImpl(const SpecDecConfig& config, const ModelConfig& target);

  const SpecDecConfig& config() const { return config_; }
  // cos/sin [N, head_dim] for positions [N] int64, in the module's device and dtype.
  std::pair<torch::Tensor, torch::Tensor> RopeFor(const torch::Tensor& positions);

  // tokens [N] int64 -> encoder states [N, d] (after the encoder's final norm). `kv`: the L_e
  // encoder caches (paged) or null (dense `in`).
  torch::Tensor Encode(const torch::Tensor& tokens, const AttentionInputs& in,
                       std::vector<LayerKvCache>* kv);
  // Decoder layer `layer`'s cross keys (rotated by cos/sin [N, hd]) and values of encoder states
  // [N, d]: [N, n_kv, head_dim] each.
  std::pair<torch::Tensor, torch::Tensor> CrossKeyValues(int64_t layer, const torch::Tensor& states,
                                                         const torch::Tensor& cos,
                                                         const torch::Tensor& sin);
  // Slot inputs [R, d]: slot[r] in [0, k) picks the slot embedding; revealed[r] >= 0 puts that
  // token's embedding in place of [MASK] (glancing training), -1 keeps [MASK]. Both [R] int64.
  torch::Tensor SlotInputs(const torch::Tensor& slot, const torch::Tensor& revealed);
  // Serving: slot rows x [R, d] through the decoder layers over paged inputs whose layout puts
  // each sequence's slots in one AddBidirectionalBlock after its cross cache; the slots' keys are
  // written to `kv` (the L_d decoder caches). -> logits [R, V].
  torch::Tensor DecodePaged(torch::Tensor x, const AttentionInputs& in,
                            std::vector<LayerKvCache>* kv);
  // hidden [..., d] -> logits [..., V] through the final decoder norm and the tied head.
  torch::Tensor Logits(const torch::Tensor& hidden);

  // Training (dense, autograd): windows tokens [B, T] int64; split [B, S] int64 (the index p of
  // the last prefix token of each of S drafts per window, 0 <= p < T); revealed [B, S, k] int64
  // (-1 = [MASK], else a gold token shown as input). -> logits [B, S, k, V] (float32), slot j of
  // draft (b, s) predicting position split[b, s] + 1 + j.
  torch::Tensor TrainLogits(const torch::Tensor& tokens, const torch::Tensor& split,
                            const torch::Tensor& revealed);

  // HF-style init of every layer (normal 0.02, depth-scaled residual projections, unit norms).
  void InitWeights(uint64_t seed);
  // Initialises the context encoder from a token-only Llama LM of the encoder's geometry (e.g.
  // models/pyllama-draft-1m): its embedding (also the tied head), final norm and first
  // min(its layers, L_e) layers; the other encoder layers and the decoder keep their init. A
  // config field that differs from the encoder's, an untied head, or a missing or misshapen
  // tensor: INVALID_ARGUMENT naming it. Returns the layers copied.
  StatusOr<int64_t> InitEncoderFrom(const std::string& lm_dir);
  // Fuses q/k/v and gate/up of every layer for serving (see CausalLMImpl::FuseForServing).
  void FuseForServing();

  CausalLM encoder{nullptr};               // "encoder.model.*": embedding, L_e layers, norm
  torch::nn::ModuleList decoder{nullptr};  // "decoder.i": L_d DecoderLayers
  RMSNorm decoder_norm{nullptr};
  torch::Tensor mask_embedding;  // [d]
  torch::Tensor slot_embedding;  // [k, d]

 private:
  DecoderLayerImpl& DecoderLayerAt(int64_t i);

  SpecDecConfig config_;
  ModelConfig layer_config_;
  torch::Tensor inv_freq_;  // [head_dim / 2] float32 on the CPU; deliberately not a buffer
};
TORCH_MODULE(SpecDec);

// Saves `model` as a checkpoint directory (config.json + model.safetensors).
Status SaveSpecDecDir(SpecDecImpl& model, const std::string& dir);
// Loads a checkpoint directory for `target` (CPU, float32, eval mode). NOT_FOUND without
// config.json; INVALID_ARGUMENT for a bad config, another target or misshaped tensors.
StatusOr<std::shared_ptr<SpecDecImpl>> LoadSpecDecDir(const std::string& dir,
                                                      const ModelConfig& target);

}  // namespace specula
