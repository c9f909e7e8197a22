#include "common/model/transformer.h"

#include <cmath>

#include "common/model/rope.h"

namespace specula {

namespace F = torch::nn::functional;

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
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

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const AttentionInputs& in,
                                         LayerKvCache* kv) {
  const int64_t N = x.size(0);
  auto q = q_proj(x).view({N, num_heads_, head_dim_});
  auto k = k_proj(x).view({N, num_kv_heads_, head_dim_});
  auto v = v_proj(x).view({N, num_kv_heads_, head_dim_});
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = ApplyRope(q, in.cos, in.sin);
  k = ApplyRope(k, in.cos, in.sin);

  const int64_t B = in.batch, Tq = in.max_q, Tk = in.max_k;
  torch::Tensor q_pad, k_all, v_all;
  if (in.paged()) {
    kv->keys.index_copy_(0, in.write_slots, k.to(kv->keys.scalar_type()));
    kv->values.index_copy_(0, in.write_slots, v.to(kv->values.scalar_type()));
    k_all = kv->keys.index_select(0, in.read_slots).view({B, Tk, num_kv_heads_, head_dim_});
    v_all = kv->values.index_select(0, in.read_slots).view({B, Tk, num_kv_heads_, head_dim_});
    q_pad = torch::zeros({B * Tq, num_heads_, head_dim_}, q.options()).index_copy(0, in.q_index, q);
    q_pad = q_pad.view({B, Tq, num_heads_, head_dim_});
  } else {
    q_pad = q.view({B, Tq, num_heads_, head_dim_});
    k_all = k.view({B, Tk, num_kv_heads_, head_dim_});
    v_all = v.view({B, Tk, num_kv_heads_, head_dim_});
  }
  auto out =
      MaskedAttention(q_pad, k_all, v_all, in.mask).reshape({B * Tq, num_heads_ * head_dim_});
  if (in.paged()) out = out.index_select(0, in.q_index);
  return o_proj(out);
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

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return down_proj(F::silu(gate_proj(x)) * up_proj(x));
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
  auto h = x + self_attn(input_layernorm(x), in, kv);
  return h + mlp(post_attention_layernorm(h));
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

const torch::Tensor& CausalLMImpl::lm_head_weight() const {
  return lm_head ? lm_head->weight : model->embed_tokens->weight;
}

torch::Tensor CausalLMImpl::Logits(const torch::Tensor& hidden) {
  return F::linear(hidden, lm_head_weight());
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
