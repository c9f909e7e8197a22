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

}  // namespace

SpecFormerCpuForward::SpecFormerCpuForward(SpecFormerImpl& module)
    : layers_(module.layer_config()) {
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
  return layers_.AttentionApplies(*module.context_attn) &&
         layers_.AttentionApplies(*module.draft_attn) && layers_.MlpApplies(*module.draft_mlp) &&
         KernelWeight(module.downsampler->weight) && KernelWeight(module.positional_ffn->weight) &&
         KernelWeight(module.positional_ffn->bias) && KernelWeight(module.context_norm->weight) &&
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
  layers_.Matmul(hooked, N, K * d, module.downsampler->weight, d, nullptr, nullptr, x);
  // Context: c = x + attention(norm(x)) over the sequence's cache.
  TORCH_CHECK(KernelWeight(kv.keys) && KernelWeight(kv.values),
              "SpecFormerCpuForward: the context cache must be contiguous float32");
  for (int64_t p : layout.positions()) {
    TORCH_CHECK(p >= 0 && p < cos_.size(0), "SpecFormerCpuForward: position ", p);
  }
  at::Tensor out = at::empty({N, d}, at::kFloat);
  layers_.AttentionBlock(*module.context_attn, module.context_norm->weight.data_ptr<float>(), x, N,
                         layout, cos_.data_ptr<float>(), sin_.data_ptr<float>(),
                         kv.keys.data_ptr<float>(), kv.values.data_ptr<float>(), kv.keys.size(0),
                         out.data_ptr<float>());
  return out;
}

void SpecFormerCpuForward::DraftBlock(SpecFormerImpl& module, float* x, int64_t rows,
                                      const PagedAttentionLayout& layout) {
  const ModelConfig& c = module.layer_config();
  const int64_t nk = c.num_key_value_heads * c.head_dim;
  // x += attention(norm(x)) among the slots (keys in a scratch cache, one block per sequence),
  // then x += mlp(norm(x)).
  float* h = hooked_.Get(rows * c.hidden_size);
  layers_.AttentionBlock(*module.draft_attn, module.draft_attn_norm->weight.data_ptr<float>(), x,
                         rows, layout, cos_.data_ptr<float>(), sin_.data_ptr<float>(),
                         keys_.Get(rows * nk), values_.Get(rows * nk), rows, h);
  layers_.MlpBlock(*module.draft_mlp, module.draft_mlp_norm->weight.data_ptr<float>(), h, rows, x);
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
  layers_.Matmul(normed, M, d, module.positional_ffn->weight, l * d,
                 module.positional_ffn->bias.data_ptr<float>(), nullptr, x);
  // Each sequence's slots as one block of the scratch cache, as Slots lays them out.
  std::vector<std::vector<int32_t>> tables;
  const PagedAttentionLayout layout = SlotLayout(M, l, config.causal_draft, tables);
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
  layers_.Head(head, head.full_weight(), states, R, logits.data_ptr<float>());
  return logits;
}

}  // namespace specula
