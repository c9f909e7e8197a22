#include "common/drafters/specformer/specformer_cpu_forward.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "common/drafters/specformer/specformer_model.h"
#include "common/model/cpu_kernels.h"
#include "common/model/draft_head.h"
#include "common/model/paged_attention_layout.h"

namespace specula {

namespace {

bool KernelWeight(const torch::Tensor& t) { return CpuKernelsApply(t) && t.is_contiguous(); }

bool AttentionApplies(const SelfAttentionImpl& attn) {
  return attn.fused() && KernelWeight(attn.qkv_weight()) && !attn.qkv_bias().defined() &&
         KernelWeight(attn.o_proj->weight) && !attn.o_proj->bias.defined() && !attn.q_norm;
}

// One attention layer of the drafter (no biases, no q/k norm: SpecFormerConfig::LayerConfig):
// out = residual + o(attention(rope(q), rope(k), v)) with q, k, v of `normed`, the rows' keys and
// values written to `keys`/`values` at the layout's write slots.
struct AttentionBuffers {
  float* qkv;
  float* q_rot;
  float* attn;
};
void Attention(const SelfAttentionImpl& attn, const ModelConfig& c, const float* normed,
               int64_t rows, const PagedAttentionLayout& layout, const float* cos, const float* sin,
               float* keys, float* values, int64_t num_slots, const AttentionBuffers& buf,
               const float* residual, float* out) {
  const int64_t d = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  const int64_t hd = c.head_dim, nq = nh * hd, nk = nkv * hd, width = nq + 2 * nk;
  SmallMatmulRaw(normed, rows, d, attn.qkv_weight().data_ptr<float>(), width, nullptr, nullptr,
                 buf.qkv);
  RopeAndCacheRaw({.q = buf.qkv,
                   .k = buf.qkv + nq,
                   .v = buf.qkv + nq + nk,
                   .q_stride = width,
                   .k_stride = width,
                   .v_stride = width,
                   .q_head_stride = hd,
                   .k_head_stride = hd,
                   .v_head_stride = hd,
                   .rows = rows,
                   .num_heads = nh,
                   .num_kv_heads = nkv,
                   .head_dim = hd,
                   .cos = cos,
                   .sin = sin,
                   .cos_row = layout.positions().data(),
                   .write_slots = layout.write_slots().data()},
                  num_slots, keys, values, buf.q_rot);
  PagedAttentionRaw(buf.q_rot, rows, nh, hd, nkv, keys, values, layout, buf.attn);
  SmallMatmulRaw(buf.attn, rows, nq, attn.o_proj->weight.data_ptr<float>(), d, nullptr, residual,
                 out);
}

}  // namespace

float* SpecFormerCpuForward::Scratch::Get(int64_t floats) {
  if (!storage.defined() || storage.numel() < floats) {
    storage = at::empty({std::max<int64_t>(floats, 1)}, at::kFloat);
  }
  return storage.data_ptr<float>();
}

SpecFormerCpuForward::SpecFormerCpuForward(SpecFormerImpl& module) : head_(module.layer_config()) {
  c10::InferenceMode inference;
  const int64_t positions = module.layer_config().max_position_embeddings;
  auto [cos, sin] = module.RopeFor(torch::arange(positions, torch::kLong));
  cos_ = cos.to(torch::kCPU).contiguous();
  sin_ = sin.to(torch::kCPU).contiguous();
}

bool SpecFormerCpuForward::Applies(SpecFormerImpl& module, int64_t rows) const {
  if (rows < 1 || rows > kSmallMatmulMaxRows) return false;
  const ModelConfig& c = module.layer_config();
  const int64_t d = c.hidden_size, nq = c.num_attention_heads * c.head_dim;
  if (d % 16 != 0 || nq % 16 != 0 || c.intermediate_size % 16 != 0) return false;
  if (!CpuKernelsApply(cos_) || cos_.size(1) != c.head_dim) return false;
  const DraftHead& head = module.head();
  if (!head.defined() ||
      !KernelWeight(head.restricted() ? head.restricted_rows() : head.full_weight())) {
    return false;
  }
  if (module.config().pending_token && !KernelWeight(module.target_embedding())) return false;
  for (const auto& norm : *module.hook_norms) {
    if (!KernelWeight(norm->as<RMSNorm>()->weight)) return false;
  }
  return AttentionApplies(*module.context_attn) && AttentionApplies(*module.draft_attn) &&
         module.draft_mlp->fused() && KernelWeight(module.draft_mlp->gate_up_weight()) &&
         KernelWeight(module.draft_mlp->down_proj->weight) &&
         !module.draft_mlp->down_proj->bias.defined() && KernelWeight(module.downsampler->weight) &&
         KernelWeight(module.positional_ffn->weight) && KernelWeight(module.positional_ffn->bias) &&
         KernelWeight(module.context_norm->weight) &&
         KernelWeight(module.positional_norm->weight) &&
         KernelWeight(module.draft_attn_norm->weight) &&
         KernelWeight(module.draft_mlp_norm->weight) && KernelWeight(module.head_norm_weight());
}

at::Tensor SpecFormerCpuForward::Context(SpecFormerImpl& module,
                                         const std::vector<std::vector<at::Tensor>>& hidden,
                                         const std::vector<int64_t>& next_tokens,
                                         const PagedAttentionLayout& layout, LayerKvCache& kv) {
  const ModelConfig& c = module.layer_config();
  const SpecFormerConfig& config = module.config();
  const int64_t N = layout.num_rows(), d = c.hidden_size, K = config.hook_inputs();
  const int64_t hooked_layers = static_cast<int64_t>(config.hidden_layers.size());
  const double eps = config.rms_norm_eps;
  TORCH_CHECK(N >= 1 && N <= kSmallMatmulMaxRows, "SpecFormerCpuForward: ", N, " rows");
  // Hook: each hooked state and the pending token's embedding normed into its slice of the
  // downsampler's input row [K * d] (torch::cat's layout; a row's norm is its own).
  float* hooked = hooked_.Get(N * K * d);
  int64_t row = 0;
  for (const std::vector<at::Tensor>& states : hidden) {
    TORCH_CHECK(static_cast<int64_t>(states.size()) == hooked_layers,
                "SpecFormerCpuForward: one state per hooked layer");
    const int64_t n = states[0].size(0);
    for (int64_t k = 0; k < hooked_layers; ++k) {
      const at::Tensor& s = states[k];
      TORCH_CHECK(CpuKernelsApply(s) && s.is_contiguous() && s.dim() == 2 && s.size(0) == n &&
                      s.size(1) == d,
                  "SpecFormerCpuForward: hidden states must be float32 [rows, d]");
      const float* w = module.hook_norms[k]->as<RMSNorm>()->weight.data_ptr<float>();
      for (int64_t r = 0; r < n; ++r) {
        RmsNormRaw(s.data_ptr<float>() + r * d, w, hooked + (row + r) * K * d + k * d, 1, d, eps);
      }
    }
    row += n;
  }
  TORCH_CHECK(row == N, "SpecFormerCpuForward: ", row, " hidden rows for ", N, " layout rows");
  if (config.pending_token) {
    TORCH_CHECK(static_cast<int64_t>(next_tokens.size()) == N,
                "SpecFormerCpuForward: one next token per row");
    const at::Tensor& embedding = module.target_embedding();
    const float* w = module.hook_norms[hooked_layers]->as<RMSNorm>()->weight.data_ptr<float>();
    for (int64_t r = 0; r < N; ++r) {
      TORCH_CHECK(next_tokens[r] >= 0 && next_tokens[r] < embedding.size(0),
                  "SpecFormerCpuForward: token ", next_tokens[r]);
      RmsNormRaw(embedding.data_ptr<float>() + next_tokens[r] * d, w,
                 hooked + r * K * d + hooked_layers * d, 1, d, eps);
    }
  }
  float* x = x_.Get(N * d);
  SmallMatmulRaw(hooked, N, K * d, module.downsampler->weight.data_ptr<float>(), d, nullptr,
                 nullptr, x);
  // Context: c = x + attention(norm(x)) over the sequence's cache.
  float* normed = normed_.Get(N * d);
  RmsNormRaw(x, module.context_norm->weight.data_ptr<float>(), normed, N, d, eps);
  TORCH_CHECK(KernelWeight(kv.keys) && KernelWeight(kv.values),
              "SpecFormerCpuForward: the context cache must be contiguous float32");
  for (int64_t p : layout.positions()) {
    TORCH_CHECK(p >= 0 && p < cos_.size(0), "SpecFormerCpuForward: position ", p);
  }
  const int64_t nq = c.num_attention_heads * c.head_dim, nk = c.num_key_value_heads * c.head_dim;
  at::Tensor out = at::empty({N, d}, at::kFloat);
  Attention(
      *module.context_attn, c, normed, N, layout, cos_.data_ptr<float>(), sin_.data_ptr<float>(),
      kv.keys.data_ptr<float>(), kv.values.data_ptr<float>(), kv.keys.size(0),
      {.qkv = qkv_.Get(N * (nq + 2 * nk)), .q_rot = q_rot_.Get(N * nq), .attn = attn_.Get(N * nq)},
      /*residual=*/x, out.data_ptr<float>());
  return out;
}

void SpecFormerCpuForward::DraftBlock(SpecFormerImpl& module, float* x, int64_t rows,
                                      const PagedAttentionLayout& layout) {
  const ModelConfig& c = module.layer_config();
  const int64_t d = c.hidden_size, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t nq = c.num_attention_heads * hd, nk = nkv * hd, f = c.intermediate_size;
  const double eps = module.config().rms_norm_eps;
  // x += attention(norm(x)) among the slots (keys in a scratch cache, one block per sequence),
  // then x += mlp(norm(x)).
  float* normed = normed_.Get(rows * d);
  float* h = hooked_.Get(rows * d);
  RmsNormRaw(x, module.draft_attn_norm->weight.data_ptr<float>(), normed, rows, d, eps);
  Attention(*module.draft_attn, c, normed, rows, layout, cos_.data_ptr<float>(),
            sin_.data_ptr<float>(), keys_.Get(rows * nk), values_.Get(rows * nk), rows,
            {.qkv = qkv_.Get(rows * (nq + 2 * nk)),
             .q_rot = q_rot_.Get(rows * nq),
             .attn = attn_.Get(rows * nq)},
            /*residual=*/x, h);
  RmsNormRaw(h, module.draft_mlp_norm->weight.data_ptr<float>(), normed, rows, d, eps);
  float* gate_up = gate_up_.Get(rows * 2 * f);
  float* act = act_.Get(rows * f);
  SmallMatmulRaw(normed, rows, d, module.draft_mlp->gate_up_weight().data_ptr<float>(), 2 * f,
                 nullptr, nullptr, gate_up);
  SiluMulRaw(gate_up, act, rows, f);
  SmallMatmulRaw(act, rows, f, module.draft_mlp->down_proj->weight.data_ptr<float>(), d, nullptr,
                 /*residual=*/h, x);
}

at::Tensor SpecFormerCpuForward::DraftLogits(SpecFormerImpl& module,
                                             const std::vector<const float*>& c, int64_t slots) {
  const SpecFormerConfig& config = module.config();
  const int64_t M = static_cast<int64_t>(c.size()), d = module.layer_config().hidden_size;
  const int64_t l_d = config.draft_len;
  const int64_t wanted = slots < 0 ? l_d : std::min(slots, l_d);
  const int64_t l = config.causal_draft ? wanted : l_d;  // the slots that must run (Slots)
  const int64_t rows = M * l;
  TORCH_CHECK(rows >= 1 && rows <= kSmallMatmulMaxRows, "SpecFormerCpuForward: ", rows, " slots");
  const double eps = config.rms_norm_eps;
  // Slot inputs: the positional FFN of norm(c), its first l * d outputs per sequence.
  float* normed = normed_.Get(std::max(M, rows) * d);
  for (int64_t m = 0; m < M; ++m) {
    RmsNormRaw(c[m], module.positional_norm->weight.data_ptr<float>(), normed + m * d, 1, d, eps);
  }
  float* x = x_.Get(rows * d);  // [M, l * d] = [M * l, d]
  SmallMatmulRaw(normed, M, d, module.positional_ffn->weight.data_ptr<float>(), l * d,
                 module.positional_ffn->bias.data_ptr<float>(), nullptr, x);
  // Each sequence's slots as one block of the scratch cache, attending causally (a chain over an
  // empty prefix) or to each other, as Slots lays them out.
  PagedAttentionLayout layout(l, /*sliding_window=*/0);
  std::vector<std::vector<int32_t>> tables(M);
  for (int64_t m = 0; m < M; ++m) {
    tables[m] = {static_cast<int32_t>(m)};
    if (config.causal_draft) {
      layout.AddSequence(tables[m], /*cached=*/0, l);
    } else {
      layout.AddBidirectionalBlock(tables[m], /*cached=*/0, l);
    }
  }
  DraftBlock(module, x, rows, layout);
  // Logits of the first `wanted` slots of each sequence: the target's final norm, then the head.
  const int64_t R = M * wanted, V = config.target_vocab_size;
  float* states = normed_.Get(R * d);
  for (int64_t m = 0; m < M; ++m) {
    RmsNormRaw(x + m * l * d, module.head_norm_weight().data_ptr<float>(), states + m * wanted * d,
               wanted, d, module.head_norm_eps());
  }
  at::Tensor logits = at::empty({M, wanted, V}, at::kFloat);
  const DraftHead& head = module.head();
  head_.Head(head, head.full_weight(), states, R, logits.data_ptr<float>());
  return logits;
}

}  // namespace specula
