#include "common/drafters/specdec/specdec_model.h"

#include <cmath>
#include <filesystem>

#include "common/drafters/drafter_checkpoint.h"
#include "common/model/checkpoint.h"
#include "common/model/rope.h"

namespace specula {

SpecDecImpl::SpecDecImpl(const SpecDecConfig& config, const ModelConfig& target)
    : config_(config), layer_config_(config.LayerConfig(target, config.encoder_layers)) {
  const int64_t d = config.hidden_size;
  encoder = register_module("encoder", CausalLM(layer_config_));
  decoder = register_module("decoder", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.decoder_layers; ++i)
    decoder->push_back(DecoderLayer(layer_config_));
  decoder_norm = register_module("decoder_norm", RMSNorm(d, layer_config_.rms_norm_eps));
  mask_embedding = register_parameter("mask_embedding", torch::zeros({d}));
  slot_embedding = register_parameter("slot_embedding", torch::zeros({config.num_slots, d}));
  inv_freq_ = RopeInverseFrequencies(layer_config_, torch::kCPU);
}

DecoderLayerImpl& SpecDecImpl::DecoderLayerAt(int64_t i) { return *decoder[i]->as<DecoderLayer>(); }

std::pair<torch::Tensor, torch::Tensor> SpecDecImpl::RopeFor(const torch::Tensor& positions) {
  const auto& w = mask_embedding;
  return RopeCosSin(inv_freq_.to(w.device()), positions.to(w.device()), w.scalar_type());
}

torch::Tensor SpecDecImpl::Encode(const torch::Tensor& tokens, const AttentionInputs& in,
                                  std::vector<LayerKvCache>* kv) {
  return encoder->forward(tokens, in, kv).last_hidden;
}

std::pair<torch::Tensor, torch::Tensor> SpecDecImpl::CrossKeyValues(int64_t layer,
                                                                    const torch::Tensor& states,
                                                                    const torch::Tensor& cos,
                                                                    const torch::Tensor& sin) {
  DecoderLayerImpl& l = DecoderLayerAt(layer);
  const int64_t N = states.size(0), nkv = config_.geometry.num_key_value_heads,
                hd = config_.geometry.head_dim;
  const torch::Tensor xn = l.input_layernorm(states);
  const auto& kp = l.self_attn->k_proj;
  const auto& vp = l.self_attn->v_proj;
  torch::Tensor k = ServingLinear(xn, kp->weight, kp->bias).view({N, nkv, hd});
  torch::Tensor v = ServingLinear(xn, vp->weight, vp->bias).view({N, nkv, hd});
  return {ApplyRope(k, cos, sin), v};
}

torch::Tensor SpecDecImpl::SlotInputs(const torch::Tensor& slot, const torch::Tensor& revealed) {
  const torch::Tensor slots = slot_embedding.index_select(0, slot.to(slot_embedding.device()));
  const torch::Tensor shown = revealed.to(slot_embedding.device());
  const torch::Tensor is_shown = shown.ge(0).unsqueeze(-1);  // [R, 1]
  if (!is_shown.any().item<bool>()) return slots + mask_embedding;
  const torch::Tensor tokens = encoder->model->embed_tokens(shown.clamp_min(0));
  return slots + torch::where(is_shown, tokens, mask_embedding.expand_as(tokens));
}

torch::Tensor SpecDecImpl::DecodePaged(torch::Tensor x, const AttentionInputs& in,
                                       std::vector<LayerKvCache>* kv) {
  for (int64_t l = 0; l < config_.decoder_layers; ++l) {
    x = DecoderLayerAt(l).forward(x, in, &(*kv)[l]);
  }
  return Logits(x);
}

torch::Tensor SpecDecImpl::Logits(const torch::Tensor& hidden) {
  return encoder->Logits(decoder_norm(hidden));
}

torch::Tensor SpecDecImpl::TrainLogits(const torch::Tensor& tokens, const torch::Tensor& split,
                                       const torch::Tensor& revealed) {
  const auto device = mask_embedding.device();
  const int64_t B = tokens.size(0), T = tokens.size(1), S = split.size(1), k = revealed.size(2);
  const int64_t M = B * S, R = M * k;
  const int64_t nh = config_.geometry.num_attention_heads,
                nkv = config_.geometry.num_key_value_heads, hd = config_.geometry.head_dim;
  const auto long_options = torch::TensorOptions().dtype(torch::kLong).device(device);

  // The encoder over whole windows (causal): a draft split at p reads states 0..p only.
  const torch::Tensor positions = torch::arange(T, long_options).repeat({B});
  const AttentionInputs dense = encoder->DenseCausalInputs(B, T, positions);
  const torch::Tensor states = Encode(tokens.to(device).reshape({B * T}), dense, nullptr);

  // Slots: rows (b, s, j) at positions split + 1 + j.
  const torch::Tensor splits = split.to(device);
  const torch::Tensor slot = torch::arange(k, long_options).repeat({M});
  torch::Tensor x = SlotInputs(slot, revealed.reshape({R}));
  const auto [slot_cos, slot_sin] =
      RopeFor((splits.unsqueeze(-1) + 1 + torch::arange(k, long_options)).reshape({R}));
  // [M, 1, 1, k, T + k]: prefix positions <= split, and every slot.
  const torch::Tensor prefix_ok =
      torch::arange(T, long_options).view({1, 1, T}).le(splits.unsqueeze(-1));  // [B, S, T]
  const torch::Tensor mask =
      torch::cat({prefix_ok.unsqueeze(2).expand({B, S, k, T}),
                  torch::ones({B, S, k, k}, long_options.dtype(torch::kBool))},
                 -1)
          .view({M, 1, 1, k, T + k});

  for (int64_t l = 0; l < config_.decoder_layers; ++l) {
    DecoderLayerImpl& layer = DecoderLayerAt(l);
    auto [cross_k, cross_v] = CrossKeyValues(l, states, dense.cos, dense.sin);  // [B*T, nkv, hd]
    auto per_draft = [&](const torch::Tensor& t) {
      return t.view({B, 1, T, nkv, hd}).expand({B, S, T, nkv, hd}).reshape({M, T, nkv, hd});
    };
    const torch::Tensor xn = layer.input_layernorm(x);
    auto& attn = *layer.self_attn;
    torch::Tensor q = ApplyRope(attn.q_proj(xn).view({R, nh, hd}), slot_cos, slot_sin);
    torch::Tensor ks = ApplyRope(attn.k_proj(xn).view({R, nkv, hd}), slot_cos, slot_sin);
    torch::Tensor vs = attn.v_proj(xn).view({R, nkv, hd});
    const torch::Tensor keys = torch::cat({per_draft(cross_k), ks.view({M, k, nkv, hd})}, 1);
    const torch::Tensor values = torch::cat({per_draft(cross_v), vs.view({M, k, nkv, hd})}, 1);
    const torch::Tensor out =
        MaskedAttention(q.view({M, k, nh, hd}), keys, values, mask).reshape({R, nh * hd});
    x = x + attn.o_proj(out);
    x = x + layer.mlp(layer.post_attention_layernorm(x));
  }
  return Logits(x).to(torch::kFloat).view({B, S, k, -1});
}

StatusOr<int64_t> SpecDecImpl::InitEncoderFrom(const std::string& lm_dir) {
  ASSIGN_OR_RETURN(ModelConfig lm,
                   ModelConfig::FromFile((std::filesystem::path(lm_dir) / "config.json").string()));
  const ModelConfig& e = layer_config_;
  const std::string where = StrCat(lm_dir, "/config.json: ");
  for (const auto& [field, got, want] :
       {std::tuple{"hidden_size", lm.hidden_size, e.hidden_size},
        std::tuple{"num_attention_heads", lm.num_attention_heads, e.num_attention_heads},
        std::tuple{"num_key_value_heads", lm.num_key_value_heads, e.num_key_value_heads},
        std::tuple{"head_dim", lm.head_dim, e.head_dim},
        std::tuple{"intermediate_size", lm.intermediate_size, e.intermediate_size},
        std::tuple{"vocab_size", lm.vocab_size, e.vocab_size}}) {
    if (got != want) {
      return InvalidArgumentError(
          StrCat(where, field, " is ", got, " but the SpecDec encoder has ", want));
    }
  }
  if (lm.rope_theta != e.rope_theta) {
    return InvalidArgumentError(StrCat(where, "rope_theta is ", lm.rope_theta,
                                       " but the SpecDec encoder has ", e.rope_theta));
  }
  if (!lm.tie_word_embeddings || lm.qkv_bias || lm.o_bias || lm.qk_norm) {
    return InvalidArgumentError(
        StrCat(where,
               "the SpecDec encoder is a Llama layer stack with a tied head "
               "(tie_word_embeddings true, no attention biases, no qk_norm)"));
  }
  ASSIGN_OR_RETURN(auto weights, LoadSafetensorsDir(lm_dir));
  const int64_t layers = std::min(lm.num_hidden_layers, e.num_hidden_layers);
  const std::string layer_prefix = "model.layers.";
  torch::NoGradGuard no_grad;
  for (auto& p : encoder->named_parameters()) {
    const std::string& name = p.key();
    if (name.rfind(layer_prefix, 0) == 0 &&
        std::stoll(name.substr(layer_prefix.size())) >= layers) {
      continue;  // deeper than the LM: keeps its init
    }
    auto it = weights.find(name);
    if (it == weights.end()) {
      return InvalidArgumentError(StrCat(lm_dir, ": checkpoint has no tensor '", name, "'"));
    }
    if (it->second.sizes() != p.value().sizes()) {
      return InvalidArgumentError(StrCat(lm_dir, ": tensor '", name, "' has shape ",
                                         c10::str(it->second.sizes()), ", the encoder's is ",
                                         c10::str(p.value().sizes())));
    }
    p.value().copy_(it->second.to(p.value().scalar_type()));
  }
  return layers;
}

void SpecDecImpl::InitWeights(uint64_t seed) {
  encoder->InitWeights(seed, /*depth_scaled=*/true);
  torch::NoGradGuard no_grad;
  for (auto& p : decoder->named_parameters()) {
    const std::string& name = p.key();
    torch::Tensor& t = p.value();
    if (name.find("norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (name.find("o_proj") != std::string::npos ||
               name.find("down_proj") != std::string::npos) {
      t.normal_(0.0, 0.02 / std::sqrt(2.0 * config_.decoder_layers));
    } else {
      t.normal_(0.0, 0.02);
    }
  }
  decoder_norm->weight.fill_(1.0);
  mask_embedding.normal_(0.0, 0.02);
  slot_embedding.normal_(0.0, 0.02);
}

void SpecDecImpl::FuseForServing() {
  encoder->FuseForServing();
  for (int64_t l = 0; l < config_.decoder_layers; ++l) {
    DecoderLayerAt(l).self_attn->FuseProjections();
    DecoderLayerAt(l).mlp->FuseProjections();
  }
}

Status SaveSpecDecDir(SpecDecImpl& model, const std::string& dir) {
  return SaveDrafterDir(model, dir, kSpecDecKind, model.config().ToJson());
}

StatusOr<std::shared_ptr<SpecDecImpl>> LoadSpecDecDir(const std::string& dir,
                                                      const ModelConfig& target) {
  return LoadDrafterDir<SpecDecImpl, SpecDecConfig>(dir, target, "SpecDec");
}

}  // namespace specula
