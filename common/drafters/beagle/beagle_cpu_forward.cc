#include "common/drafters/beagle/beagle_cpu_forward.h"

#include <torch/torch.h>

#include <cstring>

#include "common/drafters/beagle/beagle_model.h"
#include "common/model/draft_head.h"
#include "common/model/paged_attention_layout.h"

namespace specula {
namespace {

bool KernelWeight(const torch::Tensor& t) { return CpuKernelsApply(t) && t.is_contiguous(); }

}  // namespace

BeagleCpuForward::BeagleCpuForward(BeagleImpl& module) : layers_(module.layer_config()) {
  c10::InferenceMode inference;
  const int64_t positions = module.layer_config().max_position_embeddings;
  auto [cos, sin] = module.RopeFor(torch::arange(positions, torch::kLong));
  cos_ = cos.to(torch::kCPU).contiguous();
  sin_ = sin.to(torch::kCPU).contiguous();
}

bool BeagleCpuForward::Applies(BeagleImpl& module) const {
  const BeagleConfig& c = module.config();
  const int64_t d = c.target.hidden_size, nq = c.num_attention_heads * c.head_dim,
                nkv = c.num_key_value_heads * c.head_dim;
  if (d % 16 != 0 || nq % 16 != 0 || nkv % 16 != 0 || c.intermediate_size % 16 != 0) return false;
  if (!CpuKernelsApply(cos_) || cos_.size(1) != c.head_dim) return false;
  const DraftHead& head = module.head();
  if (!head.defined() ||
      !KernelWeight(head.restricted() ? head.restricted_rows() : head.full_weight())) {
    return false;
  }
  return KernelWeight(module.embedding()) && KernelWeight(module.query_norm->weight) &&
         KernelWeight(module.state_norm->weight) && KernelWeight(module.mlp_norm->weight) &&
         KernelWeight(module.q_proj->weight) && KernelWeight(module.k_proj->weight) &&
         KernelWeight(module.v_proj->weight) && KernelWeight(module.o_proj->weight) &&
         layers_.MlpApplies(*module.mlp);
}

void BeagleCpuForward::KeysValues(BeagleImpl& module, const float* states, int64_t rows,
                                  const int64_t* positions, const int64_t* slots, float* key_cache,
                                  float* value_cache, int64_t num_slots) {
  if (rows <= 0) return;
  const BeagleConfig& c = module.config();
  const int64_t d = c.target.hidden_size, hd = c.head_dim, nkv = c.num_key_value_heads * hd;
  for (int64_t i = 0; i < rows; ++i) {
    TORCH_CHECK(positions[i] >= 0 && positions[i] < cos_.size(0), "BeagleCpuForward: position ",
                positions[i]);
  }
  float* normed = normed_.Get(rows * d);
  float* k = keys_.Get(rows * nkv);
  float* v = values_.Get(rows * nkv);
  RmsNormRaw(states, module.state_norm->weight.data_ptr<float>(), normed, rows, d, c.rms_norm_eps);
  layers_.Matmul(normed, rows, d, module.k_proj->weight, nkv, nullptr, nullptr, k);
  layers_.Matmul(normed, rows, d, module.v_proj->weight, nkv, nullptr, nullptr, v);
  RopeAndCacheRaw({.q = nullptr,
                   .k = k,
                   .v = v,
                   .q_stride = 0,
                   .k_stride = nkv,
                   .v_stride = nkv,
                   .q_head_stride = 0,
                   .k_head_stride = hd,
                   .v_head_stride = hd,
                   .rows = rows,
                   .num_heads = 0,
                   .num_kv_heads = c.num_key_value_heads,
                   .head_dim = hd,
                   .cos = cos_.data_ptr<float>(),
                   .sin = sin_.data_ptr<float>(),
                   .cos_row = positions,
                   .write_slots = slots},
                  num_slots, key_cache, value_cache, nullptr);
}

const float* BeagleCpuForward::Draft(BeagleImpl& module, const int64_t* tokens,
                                     const int64_t* positions, int64_t rows,
                                     const PagedAttentionLayout& layout, const float* key_cache,
                                     const float* value_cache, const RowKeysRaw* row_keys) {
  const BeagleConfig& c = module.config();
  const int64_t d = c.target.hidden_size, H = c.num_attention_heads, hd = c.head_dim;
  const int64_t nq = H * hd;
  TORCH_CHECK(rows >= 1 && rows == layout.num_rows(), "BeagleCpuForward: ", rows,
              " rows for a layout of ", layout.num_rows());
  // Query: e(t) (the residual), q = RoPE(W_Q norm(e)).
  const at::Tensor& embedding = module.embedding();
  float* residual = residual_.Get(rows * d);
  for (int64_t i = 0; i < rows; ++i) {
    TORCH_CHECK(tokens[i] >= 0 && tokens[i] < embedding.size(0), "BeagleCpuForward: token ",
                tokens[i]);
    TORCH_CHECK(positions[i] >= 0 && positions[i] < cos_.size(0), "BeagleCpuForward: position ",
                positions[i]);
    std::memcpy(residual + i * d, embedding.data_ptr<float>() + tokens[i] * d, d * sizeof(float));
  }
  float* normed = normed_.Get(rows * d);
  float* q = q_.Get(rows * nq);
  float* q_rot = q_rot_.Get(rows * nq);
  RmsNormRaw(residual, module.query_norm->weight.data_ptr<float>(), normed, rows, d,
             c.rms_norm_eps);
  layers_.Matmul(normed, rows, d, module.q_proj->weight, nq, nullptr, nullptr, q);
  RopeRaw(q, rows, nq, H, hd, hd, cos_.data_ptr<float>(), sin_.data_ptr<float>(), positions, q_rot);
  // Cross attention over the true states (and the row's own drafted states).
  float* attn = attn_.Get(rows * nq);
  PagedAttentionRaw(q_rot, rows, H, hd, c.num_key_value_heads, key_cache, value_cache, layout, attn,
                    row_keys);
  // Output: y = e + W_O attn, h = y + SwiGLU(norm(y)).
  float* y = y_.Get(rows * d);
  float* h = h_.Get(rows * d);
  layers_.Matmul(attn, rows, nq, module.o_proj->weight, d, nullptr, residual, y);
  layers_.MlpBlock(*module.mlp, module.mlp_norm->weight.data_ptr<float>(), y, rows, h);
  return h;
}

const float* BeagleCpuForward::Scores(BeagleImpl& module, const float* h, int64_t rows) {
  const DraftHead& head = module.head();
  const at::Tensor& weight = head.restricted() ? head.restricted_rows() : head.full_weight();
  const int64_t n = weight.size(0), d = module.config().target.hidden_size;
  float* scores = scores_.Get(rows * n);
  layers_.Matmul(h, rows, d, weight, n, nullptr, nullptr, scores);
  return scores;
}

}  // namespace specula
