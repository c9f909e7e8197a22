#include "common/drafters/beagle/beagle_model.h"

#include <cmath>
#include <limits>

#include "common/drafters/drafter_checkpoint.h"
#include "common/model/rope.h"

namespace specula {

BeagleImpl::BeagleImpl(const BeagleConfig& config, const ModelConfig& target)
    : config_(config), layer_config_(config.LayerConfig(target)) {
  const int64_t d = config.target.hidden_size;
  const double eps = config.rms_norm_eps;
  auto linear = [](int64_t in, int64_t out) {
    return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
  };
  query_norm = register_module("query_norm", RMSNorm(d, eps));
  state_norm = register_module("state_norm", RMSNorm(d, eps));
  q_proj = register_module("q_proj", linear(d, config.num_attention_heads * config.head_dim));
  k_proj = register_module("k_proj", linear(d, config.num_key_value_heads * config.head_dim));
  v_proj = register_module("v_proj", linear(d, config.num_key_value_heads * config.head_dim));
  o_proj = register_module("o_proj", linear(config.num_attention_heads * config.head_dim, d));
  mlp_norm = register_module("mlp_norm", RMSNorm(d, eps));
  mlp = register_module("mlp", Mlp(layer_config_));
  inv_freq_ = RopeInverseFrequencies(layer_config_, torch::kCPU);
}

void BeagleImpl::SetTargetWeights(const torch::Tensor& embedding, const torch::Tensor& lm_head) {
  embedding_ = embedding.detach();
  head_.Set(lm_head);
}

std::pair<torch::Tensor, torch::Tensor> BeagleImpl::RopeFor(const torch::Tensor& positions) {
  const auto& w = q_proj->weight;
  return RopeCosSin(inv_freq_.to(w.device()), positions.to(w.device()), w.scalar_type());
}

BeagleImpl::QueryStates BeagleImpl::Query(const torch::Tensor& tokens,
                                          const torch::Tensor& positions) {
  TORCH_CHECK(embedding_.defined(), "Beagle: SetTargetWeights was not called");
  const int64_t N = tokens.size(0);
  QueryStates out;
  out.residual = embedding_.index_select(0, tokens.to(embedding_.device()));
  auto q = ServingLinear(query_norm(out.residual), q_proj->weight, {})
               .view({N, config_.num_attention_heads, config_.head_dim});
  auto [cos, sin] = RopeFor(positions);
  out.q = ApplyRope(q, cos, sin);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> BeagleImpl::KeysValues(const torch::Tensor& states,
                                                               const torch::Tensor& positions) {
  const int64_t N = states.size(0);
  auto s = state_norm(states);
  auto k =
      ServingLinear(s, k_proj->weight, {}).view({N, config_.num_key_value_heads, config_.head_dim});
  auto v =
      ServingLinear(s, v_proj->weight, {}).view({N, config_.num_key_value_heads, config_.head_dim});
  auto [cos, sin] = RopeFor(positions);
  return {ApplyRope(k, cos, sin), v};
}

torch::Tensor BeagleImpl::Output(const torch::Tensor& residual, const torch::Tensor& attn) {
  auto y = ServingLinear(attn, o_proj->weight, {}, &residual);
  auto down_in = mlp->Activation(mlp_norm(y));
  return ServingLinear(down_in, mlp->down_proj->weight, {}, &y);
}

torch::Tensor BeagleImpl::Logits(const torch::Tensor& h) {
  TORCH_CHECK(head_.defined(), "Beagle: SetTargetWeights was not called");
  return head_(h);
}

void BeagleImpl::InitWeights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    auto& t = p.value();
    if (name.find("norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (name.find("o_proj") != std::string::npos ||
               name.find("down_proj") != std::string::npos) {
      t.normal_(0.0, 0.02 / std::sqrt(2.0));
    } else {
      t.normal_(0.0, 0.02);
    }
  }
}

torch::Tensor BeagleCrossAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const torch::Tensor& mask,
                                   const torch::Tensor& row_k, const torch::Tensor& row_v,
                                   const torch::Tensor& row_mask) {
  const int64_t B = q.size(0), F = q.size(1), H = q.size(2), dh = q.size(3);
  const int64_t T = k.size(1), Hkv = k.size(2), G = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  // [B, Hkv, G, F, dh] queries; [B, Hkv, 1, T, dh] shared keys/values.
  auto qf = q.to(torch::kFloat).view({B, F, Hkv, G, dh}).permute({0, 2, 3, 1, 4});
  auto kf = k.to(torch::kFloat).permute({0, 2, 1, 3}).unsqueeze(2);
  auto vf = v.to(torch::kFloat).permute({0, 2, 1, 3}).unsqueeze(2);
  auto scores = torch::matmul(qf, kf.transpose(-1, -2)) * scale;  // [B, Hkv, G, F, T]
  auto visible = mask.view({B, 1, 1, F, T});
  const bool rows = row_k.defined() && row_k.size(2) > 0;
  torch::Tensor rkf, rvf;
  if (rows) {
    // [B, Hkv, 1, F, D, dh]: each query row's own keys.
    rkf = row_k.to(torch::kFloat).permute({0, 3, 1, 2, 4}).unsqueeze(2);
    rvf = row_v.to(torch::kFloat).permute({0, 3, 1, 2, 4}).unsqueeze(2);
    auto row_scores = (qf.unsqueeze(-2) * rkf).sum(-1) * scale;  // [B, Hkv, G, F, D]
    scores = torch::cat({scores, row_scores}, -1);
    visible = torch::cat({visible, row_mask.view({B, 1, 1, F, row_k.size(2)})}, -1);
  }
  // A finite fill keeps rows without any visible key NaN-free (uniform weights, zeroed below).
  scores = scores.masked_fill(visible.logical_not(), std::numeric_limits<float>::lowest());
  auto probs = torch::softmax(scores, -1) * visible.to(torch::kFloat);
  auto out = torch::matmul(probs.narrow(-1, 0, T), vf);  // [B, Hkv, G, F, dh]
  if (rows) out = out + (probs.narrow(-1, T, row_k.size(2)).unsqueeze(-1) * rvf).sum(-2);
  return out.permute({0, 3, 1, 2, 4}).reshape({B, F, H * dh}).to(q.scalar_type());
}

Status SaveBeagleDir(BeagleImpl& model, const std::string& dir) {
  return SaveDrafterDir(model, dir, kBeagleKind, model.config().ToJson());
}

StatusOr<std::shared_ptr<BeagleImpl>> LoadBeagleDir(const std::string& dir,
                                                    const ModelConfig& target) {
  return LoadDrafterDir<BeagleImpl, BeagleConfig>(dir, target, "Beagle");
}

}  // namespace specula
