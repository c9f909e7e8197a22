#include "common/model/transformer.h"

#include <cmath>
#include <optional>

#include "common/model/cpu_kernels.h"
#include "common/model/paged_attention.h"
#include "common/model/rope.h"

namespace specula {

namespace F = torch::nn::functional;

torch::Tensor RmsNormFewOps(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& eps) {
  auto norm = at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true, torch::kFloat);
  auto inv = torch::addcmul(eps, norm, norm, 1.0 / static_cast<double>(x.size(-1))).rsqrt_();
  return weight * (x * inv).to(x.scalar_type());
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() && CpuKernelsApply(x) && CpuKernelsApply(weight)) {
    return RmsNormCpu(x, weight, eps_);  // one pass instead of six ops
  }
  if (!torch::GradMode::is_enabled()) {  // inference elsewhere (a GPU, half precision)
    if (!eps_tensor_.defined() || eps_tensor_.device() != x.device()) {
      eps_tensor_ =
          torch::full({}, eps_, torch::TensorOptions().dtype(torch::kFloat).device(x.device()));
    }
    return RmsNormFewOps(x, weight, eps_tensor_);
  }
  // As HF: normalise in float32, cast back, then scale.
  auto xf = x.to(torch::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * torch::rsqrt(var + eps_)).to(x.scalar_type());
}

SelfAttentionImpl::SelfAttentionImpl(const ModelConfig& c)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim) {
  const int64_t d = c.hidden_size;
  q_proj = register_module(
      "q_proj",
      torch::nn::Linear(torch::nn::LinearOptions(d, num_heads_ * head_dim_).bias(c.qkv_bias)));
  k_proj = register_module(
      "k_proj",
      torch::nn::Linear(torch::nn::LinearOptions(d, num_kv_heads_ * head_dim_).bias(c.qkv_bias)));
  v_proj = register_module(
      "v_proj",
      torch::nn::Linear(torch::nn::LinearOptions(d, num_kv_heads_ * head_dim_).bias(c.qkv_bias)));
  o_proj = register_module(
      "o_proj",
      torch::nn::Linear(torch::nn::LinearOptions(num_heads_ * head_dim_, d).bias(c.o_bias)));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps));
  }
}

torch::Tensor MaskedAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& mask) {
  const int64_t B = q.size(0), Tq = q.size(1), nh = q.size(2), hd = q.size(3);
  const int64_t Tk = k.size(1), nkv = k.size(2), group = nh / nkv;
  // Grouped-query attention with the group folded into the query axis: [B, nkv, Tq * g, hd] against
  // [B, nkv, Tk, hd]. Plain batched matmuls, so keys and values are never expanded per query head.
  auto qg =
      q.view({B, Tq, nkv, group, hd}).permute({0, 2, 1, 3, 4}).reshape({B, nkv, Tq * group, hd});
  auto kg = k.permute({0, 2, 1, 3});  // [B, nkv, Tk, hd]
  auto vg = v.permute({0, 2, 1, 3});  // [B, nkv, Tk, hd]
  auto scores =
      torch::matmul(qg, kg.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  // The mask's batch is B (paged) or 1 (the dense training mask, broadcast over the batch).
  const int64_t mb = mask.size(0);
  auto allowed =
      mask.view({mb, 1, Tq, 1, Tk}).expand({mb, 1, Tq, group, Tk}).reshape({mb, 1, Tq * group, Tk});
  scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  auto probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  auto out = torch::matmul(probs, vg);  // [B, nkv, Tq * g, hd]
  return out.view({B, nkv, Tq, group, hd}).permute({0, 2, 1, 3, 4}).reshape({B, Tq, nh, hd});
}

namespace {

// Whether `part` is the view of `fused` starting `offset` elements in (fusion still holds).
bool SharesStorage(const torch::Tensor& part, const torch::Tensor& fused, int64_t offset) {
  return fused.defined() && part.defined() && part.device() == fused.device() &&
         part.scalar_type() == fused.scalar_type() &&
         static_cast<const char*>(part.data_ptr()) ==
             static_cast<const char*>(fused.data_ptr()) + offset * fused.element_size();
}

}  // namespace

torch::Tensor ServingLinear(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& bias, const torch::Tensor* residual) {
  if (x.dim() > 2 && !torch::GradMode::is_enabled()) {  // [..., in]: the kernel takes rows
    auto shape = x.sizes().vec();
    shape.back() = weight.size(0);
    std::optional<torch::Tensor> flat_residual;
    if (residual) flat_residual = residual->reshape({-1, weight.size(0)});
    return ServingLinear(x.reshape({-1, x.size(-1)}), weight, bias,
                         flat_residual ? &*flat_residual : nullptr)
        .view(shape);
  }
  if (!torch::GradMode::is_enabled() && SmallMatmulApplies(x, weight)) {
    return SmallMatmulCpu(x, weight, bias, residual);
  }
  if (residual && !bias.defined() && !torch::GradMode::is_enabled() && x.dim() == 2) {
    return torch::addmm(*residual, x, weight.t());
  }
  auto y = F::linear(x, weight, bias);
  return residual ? *residual + y : y;
}

void SelfAttentionImpl::FuseProjections() {
  torch::NoGradGuard no_grad;
  const int64_t nq = num_heads_ * head_dim_, nk = num_kv_heads_ * head_dim_;
  qkv_weight_ = torch::cat({q_proj->weight, k_proj->weight, v_proj->weight}, 0).contiguous();
  q_proj->weight.set_data(qkv_weight_.narrow(0, 0, nq));
  k_proj->weight.set_data(qkv_weight_.narrow(0, nq, nk));
  v_proj->weight.set_data(qkv_weight_.narrow(0, nq + nk, nk));
  if (q_proj->bias.defined()) {
    qkv_bias_ = torch::cat({q_proj->bias, k_proj->bias, v_proj->bias}, 0).contiguous();
    q_proj->bias.set_data(qkv_bias_.narrow(0, 0, nq));
    k_proj->bias.set_data(qkv_bias_.narrow(0, nq, nk));
    v_proj->bias.set_data(qkv_bias_.narrow(0, nq + nk, nk));
  }
}

bool SelfAttentionImpl::fused() const {
  const int64_t nq = num_heads_ * head_dim_, nk = num_kv_heads_ * head_dim_;
  const int64_t d = q_proj->weight.size(1);
  return SharesStorage(q_proj->weight, qkv_weight_, 0) &&
         SharesStorage(k_proj->weight, qkv_weight_, nq * d) &&
         SharesStorage(v_proj->weight, qkv_weight_, (nq + nk) * d) &&
         (!q_proj->bias.defined() || SharesStorage(q_proj->bias, qkv_bias_, 0));
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> SelfAttentionImpl::Project(
    const torch::Tensor& x) {
  const int64_t N = x.size(0);
  const int64_t nq = num_heads_ * head_dim_, nk = num_kv_heads_ * head_dim_;
  if (!torch::GradMode::is_enabled() && fused()) {
    auto qkv = ServingLinear(x, qkv_weight_, qkv_bias_);  // [N, nq + 2 nk]
    return {qkv.narrow(1, 0, nq).view({N, num_heads_, head_dim_}),
            qkv.narrow(1, nq, nk).view({N, num_kv_heads_, head_dim_}),
            qkv.narrow(1, nq + nk, nk).view({N, num_kv_heads_, head_dim_})};
  }
  return {ServingLinear(x, q_proj->weight, q_proj->bias).view({N, num_heads_, head_dim_}),
          ServingLinear(x, k_proj->weight, k_proj->bias).view({N, num_kv_heads_, head_dim_}),
          ServingLinear(x, v_proj->weight, v_proj->bias).view({N, num_kv_heads_, head_dim_})};
}

torch::Tensor SelfAttentionImpl::Attend(const torch::Tensor& x, const AttentionInputs& in,
                                        LayerKvCache* kv) {
  auto [q, k, v] = Project(x);
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  if (in.paged()) return PagedSelfAttention(q, k, v, in, kv->keys, kv->values);
  q = ApplyRope(q, in.cos, in.sin);
  k = ApplyRope(k, in.cos, in.sin);
  const int64_t B = in.batch, T = in.max_q;
  return MaskedAttention(q.view({B, T, num_heads_, head_dim_}),
                         k.view({B, T, num_kv_heads_, head_dim_}),
                         v.view({B, T, num_kv_heads_, head_dim_}), in.mask)
      .reshape({B * T, num_heads_ * head_dim_});
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& in,
                                         LayerKvCache* kv) {
  return ServingLinear(Attend(x, in, kv), o_proj->weight, o_proj->bias);
}

MlpImpl::MlpImpl(const ModelConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  gate_proj =
      register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(d, f).bias(false)));
  up_proj =
      register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(d, f).bias(false)));
  down_proj =
      register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(f, d).bias(false)));
}

void MlpImpl::FuseProjections() {
  torch::NoGradGuard no_grad;
  const int64_t f = gate_proj->weight.size(0);
  gate_up_weight_ = torch::cat({gate_proj->weight, up_proj->weight}, 0).contiguous();
  gate_proj->weight.set_data(gate_up_weight_.narrow(0, 0, f));
  up_proj->weight.set_data(gate_up_weight_.narrow(0, f, f));
}

bool MlpImpl::fused() const {
  const int64_t f = gate_proj->weight.size(0), d = gate_proj->weight.size(1);
  return SharesStorage(gate_proj->weight, gate_up_weight_, 0) &&
         SharesStorage(up_proj->weight, gate_up_weight_, f * d);
}

torch::Tensor MlpImpl::Activation(const torch::Tensor& x) {
  const int64_t f = gate_proj->weight.size(0);
  if (!torch::GradMode::is_enabled() && fused()) {
    auto gate_up = ServingLinear(x, gate_up_weight_, {});  // [..., 2f]
    // The one-pass kernel saves ops where op overhead dominates (a few rows); on many rows
    // LibTorch's silu and mul use both cores, the kernel one. Its bound is the small matmul's,
    // so that a forward of up to that many rows runs the same kernels as CpuForward (which
    // gives the same results on the same rows).
    constexpr int64_t kOnePassMaxRows = kSmallMatmulMaxRows;
    if (CpuKernelsApply(gate_up) && gate_up.numel() <= 2 * f * kOnePassMaxRows) {
      return SiluMulCpu(gate_up);
    }
    return F::silu(gate_up.narrow(-1, 0, f)) * gate_up.narrow(-1, f, f);
  }
  return F::silu(ServingLinear(x, gate_proj->weight, {})) * ServingLinear(x, up_proj->weight, {});
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return ServingLinear(Activation(x), down_proj->weight, {});
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", SelfAttention(c));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", Mlp(c));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const AttentionInputs& in,
                                        LayerKvCache* kv) {
  const auto& o = self_attn->o_proj;
  auto h = ServingLinear(self_attn->Attend(input_layernorm(x), in, kv), o->weight, o->bias, &x);
  const auto& down = mlp->down_proj;
  return ServingLinear(mlp->Activation(post_attention_layernorm(h)), down->weight, down->bias, &h);
}

TransformerImpl::TransformerImpl(const ModelConfig& c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

CausalLMImpl::CausalLMImpl(const ModelConfig& c) : config_(c) {
  model = register_module("model", Transformer(c));
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head",
        torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
  }
  inv_freq = RopeInverseFrequencies(c, torch::kCPU);  // float32 whatever the model dtype
}

void CausalLMImpl::FuseForServing() {
  for (const auto& layer : *model->layers) {
    auto* decoder = layer->as<DecoderLayer>();
    decoder->self_attn->FuseProjections();
    decoder->mlp->FuseProjections();
  }
}

const torch::Tensor& CausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::Logits(const torch::Tensor& hidden) {
  return ServingLinear(hidden, lm_head_weight(), {});
}

TransformerOutput CausalLMImpl::forward(const torch::Tensor& tokens, const AttentionInputs& in,
                                        std::vector<LayerKvCache>* kv_caches,
                                        const std::vector<int64_t>& hidden_layers) {
  TransformerOutput out;
  const int64_t L = config_.num_hidden_layers;
  auto want = [&](int64_t index) {
    return std::find(hidden_layers.begin(), hidden_layers.end(), index) != hidden_layers.end();
  };
  std::vector<torch::Tensor> captured(L + 1);
  auto h = model->embed_tokens(tokens);
  if (want(0)) captured[0] = h;
  for (int64_t i = 0; i < L; ++i) {
    LayerKvCache* kv = kv_caches && !kv_caches->empty() ? &(*kv_caches)[i] : nullptr;
    h = model->layers[i]->as<DecoderLayer>()->forward(h, in, kv);
    if (i + 1 < L && want(i + 1)) captured[i + 1] = h;
  }
  out.last_hidden = model->norm(h);
  captured[L] = out.last_hidden;
  for (int64_t index : hidden_layers) out.hidden_states.push_back(captured[index]);
  return out;
}

AttentionInputs CausalLMImpl::DenseCausalInputs(int64_t batch, int64_t seq_len,
                                                const torch::Tensor& positions) {
  AttentionInputs in;
  in.batch = batch;
  in.max_q = seq_len;
  in.max_k = seq_len;
  auto dtype = model->embed_tokens->weight.scalar_type();
  auto device = model->embed_tokens->weight.device();
  auto cs = RopeCosSin(inv_freq.to(device), positions.to(device), dtype);
  in.cos = cs.first;
  in.sin = cs.second;
  auto causal =
      torch::ones({seq_len, seq_len}, torch::TensorOptions().dtype(torch::kBool).device(device))
          .tril();
  if (config_.sliding_window) causal = causal.triu(-(*config_.sliding_window - 1));
  in.mask = causal.view({1, 1, 1, seq_len, seq_len});
  return in;
}

void CausalLMImpl::InitWeights(uint64_t seed, bool depth_scaled) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    auto& t = p.value();
    if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      t.zero_();
    } else if (name.find("norm") != std::string::npos) {
      t.fill_(1.0);
    } else if (depth_scaled && (name.find("o_proj") != std::string::npos ||
                                name.find("down_proj") != std::string::npos)) {
      // GPT-2's depth scaling: each layer adds two residual branches, so the residual stream's
      // variance stays independent of depth. Without it deeper stacks train slower than shallow
      // ones.
      t.normal_(0.0, 0.02 / std::sqrt(2.0 * config_.num_hidden_layers));
    } else {
      t.normal_(0.0, 0.02);
    }
  }
}

torch::ScalarType ParseTorchDtype(const std::string& name, bool* ok) {
  *ok = true;
  if (name == "float32" || name == "fp32" || name == "float") return torch::kFloat;
  if (name == "bfloat16" || name == "bf16") return torch::kBFloat16;
  if (name == "float16" || name == "fp16" || name == "half") return torch::kHalf;
  *ok = false;
  return torch::kFloat;
}

}  // namespace specula
