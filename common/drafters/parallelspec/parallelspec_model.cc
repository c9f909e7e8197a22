#include "common/drafters/parallelspec/parallelspec_model.h"

#include <cmath>

#include "common/drafters/beagle/beagle_model.h"
#include "common/drafters/drafter_checkpoint.h"
#include "common/model/rope.h"

namespace specula {

ParallelSpecImpl::ParallelSpecImpl(const ParallelSpecConfig& config, const ModelConfig& target)
    : config_(config), layer_config_(config.LayerConfig(target)) {
  const int64_t d = config.target.hidden_size;
  if (config.use_target_features) {
    fusion =
        register_module("fusion", torch::nn::Linear(torch::nn::LinearOptions(2 * d, d).bias(true)));
  }
  mask_embeddings =
      register_parameter("mask_embeddings", torch::zeros({config.num_mask_tokens, d}));
  layer = register_module("layer", DecoderLayer(layer_config_));
  inv_freq_ = RopeInverseFrequencies(layer_config_, torch::kCPU);
}

void ParallelSpecImpl::SetTargetWeights(const torch::Tensor& embedding,
                                        const torch::Tensor& lm_head) {
  embedding_ = embedding.detach();
  head_.Set(lm_head);
}

std::pair<torch::Tensor, torch::Tensor> ParallelSpecImpl::RopeFor(const torch::Tensor& positions) {
  const auto& w = mask_embeddings;
  return RopeCosSin(inv_freq_.to(w.device()), positions.to(w.device()), w.scalar_type());
}

torch::Tensor ParallelSpecImpl::RealInputs(const torch::Tensor& features,
                                           const torch::Tensor& tokens) {
  TORCH_CHECK(embedding_.defined(), "ParallelSpec: SetTargetWeights was not called");
  std::vector<int64_t> shape = tokens.sizes().vec();  // [N] or [B, T]
  shape.push_back(embedding_.size(1));
  auto e = embedding_.index_select(0, tokens.reshape({-1}).to(embedding_.device())).view(shape);
  if (!fusion) return e;
  return ServingLinear(torch::cat({features.to(e.scalar_type()), e}, -1), fusion->weight,
                       fusion->bias);
}

torch::Tensor ParallelSpecImpl::MaskInputs() {
  if (!fusion) return mask_embeddings;
  // fusion([0 ; M_i]) = W[:, d:] M_i + b: the feature half sees zeros.
  const int64_t d = mask_embeddings.size(1);
  return torch::nn::functional::linear(mask_embeddings, fusion->weight.narrow(1, d, d),
                                       fusion->bias);
}

torch::Tensor ParallelSpecImpl::Layer(const torch::Tensor& x, const AttentionInputs& in,
                                      LayerKvCache* kv) {
  return layer->forward(x, in, kv);
}

torch::Tensor ParallelSpecImpl::Logits(const torch::Tensor& h) {
  TORCH_CHECK(head_.defined(), "ParallelSpec: SetTargetWeights was not called");
  return head_(h);
}

void ParallelSpecImpl::FuseForServing() {
  layer->self_attn->FuseProjections();
  layer->mlp->FuseProjections();
}

ParallelSpecImpl::GroupOutput ParallelSpecImpl::GroupForward(const torch::Tensor& x_real,
                                                             const torch::Tensor& groups,
                                                             const torch::Tensor& group_valid) {
  const int64_t B = x_real.size(0), T = x_real.size(1), d = x_real.size(2);
  const int64_t G = groups.size(1), k = config_.num_mask_tokens;
  const int64_t H = config_.num_attention_heads, Hkv = config_.num_key_value_heads,
                dh = config_.head_dim;
  const auto device = x_real.device();
  auto& attn = layer->self_attn;
  auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);

  // Real rows: q/k/v at positions 0..T-1.
  auto real_in = layer->input_layernorm(x_real.reshape({B * T, d}));
  auto [real_cos, real_sin] = RopeFor(torch::arange(T, long_opts).repeat({B}));
  auto q_real = ApplyRope(attn->q_proj(real_in).view({B * T, H, dh}), real_cos, real_sin);
  auto k_real = ApplyRope(attn->k_proj(real_in).view({B * T, Hkv, dh}), real_cos, real_sin);
  auto v_real = attn->v_proj(real_in).view({B, T, Hkv, dh});

  // Mask rows (g, i) at positions r_g + i, i = 1..k.
  auto mask_x = MaskInputs();                     // [k, d]
  auto mask_in = layer->input_layernorm(mask_x);  // [k, d]
  auto mask_pos = groups.to(device).view({B, G, 1}) +
                  torch::arange(1, k + 1, long_opts).view({1, 1, k});  // [B, G, k]
  auto [mask_cos, mask_sin] = RopeFor(mask_pos.reshape({-1}));
  const int64_t N = B * G * k;
  auto q_mask = ApplyRope(
      attn->q_proj(mask_in).view({1, k, H, dh}).expand({B * G, k, H, dh}).reshape({N, H, dh}),
      mask_cos, mask_sin);
  auto k_mask = ApplyRope(
      attn->k_proj(mask_in).view({1, k, Hkv, dh}).expand({B * G, k, Hkv, dh}).reshape({N, Hkv, dh}),
      mask_cos, mask_sin);
  auto v_mask = attn->v_proj(mask_in).view({1, 1, k, Hkv, dh}).expand({B, G, k, Hkv, dh});

  // Queries: T real rows, then G * k mask rows per batch row.
  const int64_t F = T + G * k;
  auto q = torch::cat({q_real.view({B, T, H, dh}), q_mask.view({B, G * k, H, dh})}, 1);
  // Shared keys: real row j is visible to real row t when j <= t, to mask (r, i) when j <= r.
  auto key_pos = torch::arange(T, long_opts);
  auto last_real =
      torch::cat({torch::arange(T, long_opts).view({1, T}).expand({B, T}),
                  groups.to(device).view({B, G, 1}).expand({B, G, k}).reshape({B, G * k})},
                 1);  // [B, F]
  auto mask = key_pos.view({1, 1, T}).le(last_real.view({B, F, 1}));
  // Per-row keys: mask (g, i) sees masks (g, 1..i); real rows see none.
  auto own_k = k_mask.view({B, G, 1, k, Hkv, dh}).expand({B, G, k, k, Hkv, dh});
  auto own_v = v_mask.view({B, G, 1, k, Hkv, dh}).expand({B, G, k, k, Hkv, dh});
  auto row_k = torch::cat(
      {torch::zeros({B, T, k, Hkv, dh}, own_k.options()), own_k.reshape({B, G * k, k, Hkv, dh})},
      1);
  auto row_v = torch::cat(
      {torch::zeros({B, T, k, Hkv, dh}, own_v.options()), own_v.reshape({B, G * k, k, Hkv, dh})},
      1);
  auto tri = torch::ones({k, k}, torch::TensorOptions().dtype(torch::kBool).device(device)).tril();
  auto own_mask =
      tri.view({1, 1, k, k}).expand({B, G, k, k}) & group_valid.to(device).view({B, G, 1, 1});
  auto row_mask = torch::cat(
      {torch::zeros({B, T, k}, torch::TensorOptions().dtype(torch::kBool).device(device)),
       own_mask.reshape({B, G * k, k})},
      1);
  auto out = BeagleCrossAttention(q, k_real.view({B, T, Hkv, dh}), v_real, mask, row_k, row_v,
                                  row_mask);  // [B, F, H * dh]

  auto x =
      torch::cat({x_real, mask_x.view({1, 1, k, d}).expand({B, G, k, d}).reshape({B, G * k, d})},
                 1);  // [B, F, d]
  auto h = x + attn->o_proj(out);
  h = h + layer->mlp(layer->post_attention_layernorm(h));
  return {.real = h.narrow(1, 0, T), .masks = h.narrow(1, T, G * k).view({B, G, k, d})};
}

void ParallelSpecImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    auto& t = p.value();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      t.zero_();
    } else if (name.find("norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (name.find("o_proj") != std::string::npos ||
               name.find("down_proj") != std::string::npos) {
      t.normal_(0.0, 0.02 / std::sqrt(2.0));
    } else {
      t.normal_(0.0, 0.02);
    }
  }
}

Status SaveParallelSpecDir(ParallelSpecImpl& model, const std::string& dir) {
  return SaveDrafterDir(model, dir, kParallelSpecKind, model.config().ToJson());
}

StatusOr<std::shared_ptr<ParallelSpecImpl>> LoadParallelSpecDir(const std::string& dir,
                                                                const ModelConfig& target) {
  return LoadDrafterDir<ParallelSpecImpl, ParallelSpecConfig>(dir, target, "ParallelSpec");
}

}  // namespace specula
