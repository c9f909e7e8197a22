#include "common/model/cpu_forward.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "common/model/cpu_kernels.h"
#include "common/model/draft_head.h"
#include "common/model/paged_attention_layout.h"
#include "common/model/transformer.h"

namespace specula {

namespace {

// A float32 CPU matrix the small-matmul kernel reads as weights (or a bias): contiguous.
bool KernelWeight(const torch::Tensor& t) { return CpuKernelsApply(t) && t.is_contiguous(); }

const float* OrNull(const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

DecoderLayerImpl& LayerOf(CausalLMImpl& module, int64_t i) {
  return *module.model->layers[i]->as<DecoderLayer>();
}

}  // namespace

float* CpuScratch::Get(int64_t floats) {
  if (!storage.defined() || storage.numel() < floats) {
    storage = at::empty({std::max<int64_t>(floats, 1)}, at::kFloat);
  }
  return storage.data_ptr<float>();
}

CpuForward::CpuForward(const ModelConfig& config) : config_(config) {}

DraftMatmul CpuForward::draft_matmul() const {
  switch (draft_matmul_requested_) {
    case DraftMatmul::kBfloat16:
      return Bf16MatmulRuns() ? DraftMatmul::kBfloat16 : DraftMatmul::kFloat32;
    case DraftMatmul::kInt8:
      return Int8MatmulRuns() ? DraftMatmul::kInt8 : DraftMatmul::kFloat32;
    case DraftMatmul::kFloat32:
      break;
  }
  return DraftMatmul::kFloat32;
}

bool CpuForward::packed_weights() const { return packed_requested_ && PackedMatmulRuns(); }

template <typename Make>
const at::Tensor& CpuForward::CopyOf(WeightCopies& copies, const at::Tensor& weight,
                                     const Make& make) {
  // Inference tensors keep no version counter; they cannot change outside inference mode.
  const uint32_t version = weight.is_inference() ? 0 : weight._version();
  WeightCopy& c = copies[weight.unsafeGetTensorImpl()];
  if (!c.copy.defined() || c.data != weight.data_ptr() || c.version != version) {
    c.source = weight;
    c.data = weight.data_ptr();
    c.version = version;
    c.copy = make();
  }
  return c.copy;
}

const uint16_t* CpuForward::Bf16WeightsOf(const at::Tensor& weight) {
  const at::Tensor& copy = CopyOf(bf16_copies_, weight, [&] {
    return weight.to(at::kBFloat16).contiguous();  // rounds to nearest even
  });
  return reinterpret_cast<const uint16_t*>(copy.data_ptr<at::BFloat16>());
}

int64_t CpuForward::GroupedRows(const at::Tensor& weight, int64_t n, int64_t k) {
  // Every row of the weight is copied, so that callers reading only its first n (SpecFormer's
  // positional FFN: the slots a step wants) share one copy; a group of 16 outputs never mixes
  // rows of two groups, so the first n / 16 groups are the first n rows.
  const int64_t all_rows = weight.numel() / k;
  if (weight.numel() % k != 0 || all_rows % 16 != 0) return 0;
  TORCH_CHECK(all_rows >= n, "CpuForward: a weight of ", all_rows, " rows for ", n, " outputs");
  return all_rows;
}

CpuForward::Int8Weights CpuForward::Int8WeightsOf(const at::Tensor& weight, int64_t n, int64_t k) {
  const int64_t all_rows = GroupedRows(weight, n, k);
  if (all_rows == 0) return {};
  const at::Tensor& copy = CopyOf(int8_copies_, weight, [&] {
    // The scales first: all_rows floats, a multiple of 64 bytes, so the panels stay aligned.
    at::Tensor bytes = at::empty({all_rows * 4 + all_rows * k}, at::kByte);
    uint8_t* base = bytes.data_ptr<uint8_t>();
    PackInt8MatmulWeights(weight.data_ptr<float>(), all_rows, k,
                          reinterpret_cast<int8_t*>(base + all_rows * 4),
                          reinterpret_cast<float*>(base));
    return bytes;
  });
  const uint8_t* base = copy.data_ptr<uint8_t>();
  return {reinterpret_cast<const int8_t*>(base + all_rows * 4),
          reinterpret_cast<const float*>(base)};
}

const float* CpuForward::PackedWeightsOf(const at::Tensor& weight, int64_t n, int64_t k) {
  const int64_t all_rows = GroupedRows(weight, n, k);
  if (all_rows == 0) return nullptr;
  const at::Tensor& copy = CopyOf(packed_copies_, weight, [&] {
    at::Tensor packed = at::empty({all_rows * k}, at::kFloat);  // 64-byte aligned
    PackMatmulWeights(weight.data_ptr<float>(), all_rows, k, packed.data_ptr<float>());
    return packed;
  });
  return copy.data_ptr<float>();
}

void CpuForward::Matmul(const float* x, int64_t rows, int64_t k, const at::Tensor& weight,
                        int64_t n, const float* bias, const float* residual, float* y) {
  for (int64_t r0 = 0; r0 < rows; r0 += kSmallMatmulMaxRows) {
    MatmulBlock(x + r0 * k, std::min(kSmallMatmulMaxRows, rows - r0), k, weight, n, bias,
                residual != nullptr ? residual + r0 * n : nullptr, y + r0 * n);
  }
}

void CpuForward::MatmulBlock(const float* x, int64_t rows, int64_t k, const at::Tensor& weight,
                             int64_t n, const float* bias, const float* residual, float* y) {
  const DraftMatmul draft = draft_matmul();
  if (draft == DraftMatmul::kInt8 && n % 16 == 0 && k % 4 == 0) {
    if (const Int8Weights q = Int8WeightsOf(weight, n, k); q.panels) {
      Int8MatmulRaw(x, rows, k, q.panels, q.scales, n, bias, residual, y);
      return;
    }
  }
  if (k % 32 == 0 && draft == DraftMatmul::kBfloat16) {
    SmallMatmulBf16Raw(x, rows, k, Bf16WeightsOf(weight), n, bias, residual, y);
    return;
  }
  if (n % 16 == 0 && k % 16 == 0 && packed_weights()) {
    if (const float* packed = PackedWeightsOf(weight, n, k)) {
      PackedMatmulRaw(x, rows, k, packed, n, bias, residual, y);
      return;
    }
  }
  SmallMatmulRaw(x, rows, k, weight.data_ptr<float>(), n, bias, residual, y);
}

bool CpuForward::AttentionApplies(SelfAttentionImpl& attn) const {
  if (!attn.fused() || !KernelWeight(attn.qkv_weight()) ||
      (attn.qkv_bias().defined() && !KernelWeight(attn.qkv_bias())) ||
      !KernelWeight(attn.o_proj->weight) ||
      (attn.o_proj->bias.defined() && !KernelWeight(attn.o_proj->bias))) {
    return false;
  }
  return !config_.qk_norm ||
         (attn.q_norm && KernelWeight(attn.q_norm->weight) && KernelWeight(attn.k_norm->weight));
}

bool CpuForward::MlpApplies(MlpImpl& mlp) const {
  return mlp.fused() && KernelWeight(mlp.gate_up_weight()) && KernelWeight(mlp.down_proj->weight) &&
         (!mlp.down_proj->bias.defined() || KernelWeight(mlp.down_proj->bias));
}

bool CpuForward::LayerApplies(DecoderLayerImpl& layer) const {
  return AttentionApplies(*layer.self_attn) && MlpApplies(*layer.mlp) &&
         KernelWeight(layer.input_layernorm->weight) &&
         KernelWeight(layer.post_attention_layernorm->weight);
}

bool CpuForward::Applies(CausalLMImpl& module, int64_t rows) const {
  if (rows < 1 || rows > kSmallMatmulMaxRows) return false;
  const int64_t d = config_.hidden_size, nq = config_.num_attention_heads * config_.head_dim;
  // Every matmul's inner dimension a multiple of 16 (SmallMatmulApplies).
  if (d % 16 != 0 || nq % 16 != 0 || config_.intermediate_size % 16 != 0) return false;
  if (!KernelWeight(module.model->embed_tokens->weight) ||
      !KernelWeight(module.model->norm->weight) || !KernelWeight(module.lm_head_weight())) {
    return false;
  }
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    if (!LayerApplies(LayerOf(module, i))) return false;
  }
  return true;
}

void CpuForward::AttentionBlock(SelfAttentionImpl& attn, const float* norm_weight, const float* x,
                                int64_t N, const PagedAttentionLayout& layout,
                                const float* rope_cos, const float* rope_sin, float* keys,
                                float* values, int64_t num_slots, float* out) {
  const int64_t d = config_.hidden_size, nh = config_.num_attention_heads;
  const int64_t nkv = config_.num_key_value_heads, hd = config_.head_dim;
  const int64_t nq = nh * hd, nk = nkv * hd;
  const int64_t qkv_width = nq + 2 * nk;
  const double eps = config_.rms_norm_eps;
  TORCH_CHECK(N >= 1 && N <= kSmallMatmulMaxRows && N == layout.num_rows(), "CpuForward: ", N,
              " rows for ", layout.num_rows(), " layout rows");
  float* normed = normed_.Get(N * d);
  float* qkv = qkv_.Get(N * qkv_width);
  float* q_rot = q_rot_.Get(N * nq);
  float* attn_out = attn_.Get(N * nq);
  RmsNormRaw(x, norm_weight, normed, N, d, eps);
  Matmul(normed, N, d, attn.qkv_weight(), qkv_width, OrNull(attn.qkv_bias()), nullptr, qkv);
  RopeRows rows{.q = qkv,
                .k = qkv + nq,
                .v = qkv + nq + nk,
                .q_stride = qkv_width,
                .k_stride = qkv_width,
                .v_stride = qkv_width,
                .q_head_stride = hd,
                .k_head_stride = hd,
                .v_head_stride = hd,
                .rows = N,
                .num_heads = nh,
                .num_kv_heads = nkv,
                .head_dim = hd,
                .cos = rope_cos,
                .sin = rope_sin,
                .cos_row = layout.positions().data(),
                .write_slots = layout.write_slots().data()};
  if (config_.qk_norm) {  // Qwen3: RMSNorm over each head of q and k (contiguous copies)
    float* q_normed = q_normed_.Get(N * nq);
    float* k_normed = k_normed_.Get(N * nk);
    for (int64_t i = 0; i < N; ++i) {
      std::memcpy(q_normed + i * nq, qkv + i * qkv_width, nq * sizeof(float));
      std::memcpy(k_normed + i * nk, qkv + i * qkv_width + nq, nk * sizeof(float));
    }
    RmsNormRaw(q_normed, attn.q_norm->weight.data_ptr<float>(), q_normed, N * nh, hd, eps);
    RmsNormRaw(k_normed, attn.k_norm->weight.data_ptr<float>(), k_normed, N * nkv, hd, eps);
    rows.q = q_normed;
    rows.k = k_normed;
    rows.q_stride = nq;
    rows.k_stride = nk;
  }
  RopeAndCacheRaw(rows, num_slots, keys, values, q_rot);
  PagedAttentionRaw(q_rot, N, nh, hd, nkv, keys, values, layout, attn_out);
  Matmul(attn_out, N, nq, attn.o_proj->weight, d, OrNull(attn.o_proj->bias), /*residual=*/x, out);
}

void CpuForward::MlpBlock(MlpImpl& mlp, const float* norm_weight, const float* h, int64_t N,
                          float* out) {
  const int64_t d = config_.hidden_size, f = config_.intermediate_size;
  TORCH_CHECK(N >= 1, "CpuForward: ", N, " rows");
  float* normed = normed_.Get(N * d);
  float* gate_up = gate_up_.Get(N * 2 * f);
  float* act = act_.Get(N * f);
  RmsNormRaw(h, norm_weight, normed, N, d, config_.rms_norm_eps);
  Matmul(normed, N, d, mlp.gate_up_weight(), 2 * f, nullptr, nullptr, gate_up);
  SiluMulRaw(gate_up, act, N, f);
  Matmul(act, N, f, mlp.down_proj->weight, d, OrNull(mlp.down_proj->bias), /*residual=*/h, out);
}

void CpuForward::Layer(DecoderLayerImpl& layer, float* x, int64_t N,
                       const PagedAttentionLayout& layout, const float* rope_cos,
                       const float* rope_sin, LayerKvCache& kv) {
  TORCH_CHECK(KernelWeight(kv.keys) && KernelWeight(kv.values),
              "CpuForward: caches must be contiguous float32");
  float* h = h_.Get(N * config_.hidden_size);  // after attention
  AttentionBlock(*layer.self_attn, layer.input_layernorm->weight.data_ptr<float>(), x, N, layout,
                 rope_cos, rope_sin, kv.keys.data_ptr<float>(), kv.values.data_ptr<float>(),
                 kv.keys.size(0), h);
  MlpBlock(*layer.mlp, layer.post_attention_layernorm->weight.data_ptr<float>(), h, N, x);
}

void CpuForward::Head(const DraftHead& head, const torch::Tensor& full_weight, const float* rows,
                      int64_t R, float* logits) {
  if (R <= 0) return;
  const int64_t d = config_.hidden_size, V = config_.vocab_size;
  if (!head.restricted()) {
    TORCH_CHECK(KernelWeight(full_weight) && full_weight.size(0) == V && full_weight.size(1) == d,
                "CpuForward: the head must be float32 [vocab, d]");
    Matmul(rows, R, d, full_weight, V, nullptr, nullptr, logits);
    return;
  }
  const at::Tensor& part = head.restricted_rows();
  const at::Tensor& ids = head.restricted_ids();
  TORCH_CHECK(KernelWeight(part) && ids.is_contiguous() && ids.device().is_cpu() &&
                  ids.scalar_type() == at::kLong,
              "CpuForward: a restricted head must be float32 CPU rows with int64 ids");
  const int64_t Nv = part.size(0);
  float* scores = head_out_.Get(R * Nv);
  Matmul(rows, R, d, part, Nv, nullptr, nullptr, scores);
  std::fill(logits, logits + R * V, -std::numeric_limits<float>::infinity());
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < Nv; ++j) logits[r * V + id[j]] = scores[r * Nv + j];
  }
}

CpuForward::Result CpuForward::Run(CausalLMImpl& module, const std::vector<int64_t>& tokens,
                                   const PagedAttentionLayout& layout, const at::Tensor& rope_cos,
                                   const at::Tensor& rope_sin, std::vector<LayerKvCache>& kv,
                                   const std::vector<int64_t>& logit_rows, const DraftHead& head,
                                   const std::vector<int64_t>& hidden_layers) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  const int64_t L = config_.num_hidden_layers, d = config_.hidden_size;
  const int64_t hd = config_.head_dim, V = config_.vocab_size;
  const double eps = config_.rms_norm_eps;
  TORCH_CHECK(N >= 1 && N <= kSmallMatmulMaxRows && N == layout.num_rows(), "CpuForward: ", N,
              " tokens for ", layout.num_rows(), " layout rows");
  TORCH_CHECK(static_cast<int64_t>(kv.size()) == L, "CpuForward: one KV cache per layer");
  TORCH_CHECK(CpuKernelsApply(rope_cos) && rope_cos.is_contiguous() && rope_cos.size(1) == hd &&
                  CpuKernelsApply(rope_sin) && rope_sin.is_contiguous() &&
                  rope_sin.sizes() == rope_cos.sizes(),
              "CpuForward: RoPE tables must be float32 [positions, head_dim]");
  const std::vector<int64_t>& positions = layout.positions();
  for (int64_t p : positions) {
    TORCH_CHECK(p >= 0 && p < rope_cos.size(0), "CpuForward: position ", p, " outside RoPE table");
  }
  Result result;
  // The captured layers share one buffer (each layer's tensor a view of it), recycled from
  // capture_pool_ once no drafter backlog holds it (hidden_capture_pool.h).
  std::vector<int64_t> slot(L + 1, -1);
  int64_t captured_layers = 0;
  for (int64_t index : hidden_layers) {
    TORCH_CHECK(index >= 0 && index <= L, "CpuForward: hidden layer ", index, " outside [0, ", L,
                "]");
    if (slot[index] < 0) slot[index] = captured_layers++;
  }
  HiddenCapturePool::Capture captured;
  if (captured_layers > 0) captured = capture_pool_.Acquire(captured_layers, N, d);
  float* captured_rows = captured.data;
  const int64_t layer_stride = captured.layer_stride;
  auto want = [&](int64_t index) { return slot[index] >= 0; };
  auto capture = [&](int64_t index, const float* rows) {
    if (!want(index)) return;
    std::memcpy(captured_rows + slot[index] * layer_stride, rows, N * d * sizeof(float));
  };

  float* x = x_.Get(N * d);  // the residual stream (each layer's input and output)
  const at::Tensor& embed = module.model->embed_tokens->weight;
  const float* embed_rows = embed.data_ptr<float>();
  for (int64_t i = 0; i < N; ++i) {
    TORCH_CHECK(tokens[i] >= 0 && tokens[i] < embed.size(0), "CpuForward: token ", tokens[i]);
    std::memcpy(x + i * d, embed_rows + tokens[i] * d, d * sizeof(float));
  }
  capture(0, x);

  for (int64_t l = 0; l < L; ++l) {
    Layer(LayerOf(module, l), x, N, layout, rope_cos.data_ptr<float>(), rope_sin.data_ptr<float>(),
          kv[l]);
    if (l + 1 < L) capture(l + 1, x);
  }

  // The final norm, of every row when its states are wanted, else of the logit rows only (a
  // row's norm does not depend on the others).
  const float* final_weight = module.model->norm->weight.data_ptr<float>();
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  float* rows_out = head_rows_.Get(std::max<int64_t>(R, 1) * d);
  if (want(L)) {
    float* normed = normed_.Get(N * d);
    RmsNormRaw(x, final_weight, normed, N, d, eps);
    capture(L, normed);
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(rows_out + r * d, normed + logit_rows[r] * d, d * sizeof(float));
    }
  } else {
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(logit_rows[r] >= 0 && logit_rows[r] < N, "CpuForward: logit row ", logit_rows[r]);
      RmsNormRaw(x + logit_rows[r] * d, final_weight, rows_out + r * d, 1, d, eps);
    }
  }
  result.logits = at::empty({R, V}, at::kFloat);
  Head(head, module.lm_head_weight(), rows_out, R, result.logits.data_ptr<float>());
  for (int64_t index : hidden_layers) result.hidden.push_back(captured.layers[slot[index]]);
  return result;
}

}  // namespace specula
