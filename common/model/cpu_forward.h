// A forward of a few rows (decode steps, a draft LM's depths, short drafts' verification) of a
// float32 Llama-family model on the CPU, without LibTorch ops. For such rows the module's forward
// (transformer.cc) already runs the hand-written kernels of cpu_kernels.h, but through ~70 (the
// bundled 2-layer draft LM) to ~160 (the 6-layer target) LibTorch calls per forward, each a
// dispatch and most a new tensor: at batch 1 on two cores a quarter of a draft LM forward's
// time and a tenth of the target's (docs/BENCHMARKS.md). CpuForward calls the same kernels in the
// same order on raw pointers into the module's weights and into scratch it keeps between
// forwards, so its results are bitwise the module's (tests/model/cpu_forward_test.cc).
//
// It reads the module's parameters at every forward (no copies, nothing to go stale when weights
// are reloaded or trained in place) and applies only while they are float32 on the CPU with the
// serving fusions in place (CausalLMImpl::FuseForServing). Include only from .cc files.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/model/attention_inputs.h"
#include "common/model/draft_matmul.h"
#include "common/model/hidden_capture_pool.h"
#include "common/model/model_config.h"

namespace specula {

class CausalLMImpl;
class DecoderLayerImpl;
class DraftHead;
class MlpImpl;
class PagedAttentionLayout;
class SelfAttentionImpl;

// A float32 scratch buffer kept between forwards, allocated once at its largest size: 64-byte
// aligned as LibTorch's (the kernels' row loads straddled cache lines in std::vector's
// 16-byte-aligned rows: 10% slower at 32 rows).
struct CpuScratch {
  at::Tensor storage;
  float* Get(int64_t floats);  // at least that many floats
};

class CpuForward {
 public:
  explicit CpuForward(const ModelConfig& config);

  // Whether Run can take a forward of `rows` rows of `module` now: float32 CPU weights, fused
  // projections, at most kSmallMatmulMaxRows rows (above it the module's matmuls run on BLAS).
  bool Applies(CausalLMImpl& module, int64_t rows) const;
  // The same for one decoder layer, or its attention or MLP (a drafter's; its geometry the
  // constructor's config).
  bool LayerApplies(DecoderLayerImpl& layer) const;
  bool AttentionApplies(SelfAttentionImpl& attn) const;
  bool MlpApplies(MlpImpl& mlp) const;

  struct Result {
    at::Tensor logits;               // [logit rows, vocab] float32
    std::vector<at::Tensor> hidden;  // per requested layer index (as CausalLMImpl::forward)
  };
  // tokens [rows] in the layout's row order; layout: each row's position, write slot and visible
  // keys; rope_cos/rope_sin: [max positions, head_dim] tables; kv: one cache per layer, where the
  // rows' keys and values are written. Logits are of the final-normed rows `logit_rows`, through
  // `head` when it is restricted to a draft vocabulary, else the module's lm_head.
  Result Run(CausalLMImpl& module, const std::vector<int64_t>& tokens,
             const PagedAttentionLayout& layout, const at::Tensor& rope_cos,
             const at::Tensor& rope_sin, std::vector<LayerKvCache>& kv,
             const std::vector<int64_t>& logit_rows, const DraftHead& head,
             const std::vector<int64_t>& hidden_layers);

  // The pieces of Run, for drafters built of them (ParallelSpec's decoder layer and head,
  // SpecFormer's context attention, draft block and head). Rows are [rows, d]; `layout` places
  // them, RoPE rows come from the [positions, head_dim] tables rope_cos/rope_sin.
  // x through `layer` in place (DecoderLayerImpl::forward), keys and values written to `kv`:
  void Layer(DecoderLayerImpl& layer, float* x, int64_t rows, const PagedAttentionLayout& layout,
             const float* rope_cos, const float* rope_sin, LayerKvCache& kv);
  // Its first half: out = x + o(attention(q, k, v of norm(x))), keys and values written to the
  // [num_slots, kv heads, head_dim] caches at the layout's write slots; out must not alias x.
  void AttentionBlock(SelfAttentionImpl& attn, const float* norm_weight, const float* x,
                      int64_t rows, const PagedAttentionLayout& layout, const float* rope_cos,
                      const float* rope_sin, float* keys, float* values, int64_t num_slots,
                      float* out);
  // Its second half: out = h + down(silu(gate(norm(h))) * up(norm(h))), any number of rows.
  void MlpBlock(MlpImpl& mlp, const float* norm_weight, const float* h, int64_t rows, float* out);
  // Logits [rows, vocab] of normed rows through `head` when restricted, else full_weight.
  void Head(const DraftHead& head, const at::Tensor& full_weight, const float* rows, int64_t R,
            float* logits);

  // Drafters' forwards (DraftMatmul, --drafter-matmul): kBfloat16: every matmul whose inner
  // dimension is a multiple of 32 reads a bfloat16 copy of its weights and rounds its input rows
  // to bfloat16 (SmallMatmulBf16Raw), where the CPU has AVX512-BF16. kInt8: every matmul whose
  // outputs are whole groups of 16 reads an int8 copy scaled per output (Int8MatmulRaw), where
  // the CPU has AVX-512. Elsewhere nothing changes. Results are then no longer the module's
  // (within the copies' rounding): only for a model whose outputs are proposals the target
  // verifies. A copy is made at a weight's first use and made again when the tensor changes
  // (new storage, or an in-place op on it: its version). A write through another tensor that
  // shares its storage (a fused projection's q/k/v parameters) is not seen: call this again
  // after one (it drops every copy).
  void UseDraftMatmul(DraftMatmul matmul) {
    draft_matmul_requested_ = matmul;
    bf16_copies_.clear();
    int8_copies_.clear();
  }
  // The products that run: as asked, or kFloat32 where this CPU or build has not got them.
  DraftMatmul draft_matmul() const;

  // Float32 matmuls on a packed copy of each weight (PackedMatmulRaw) where the CPU has AVX-512:
  // the same results, bitwise, 1.1-1.3x faster forwards of the 1-16 rows of decode steps and
  // verified drafts, for a second copy of the weights this forward reads (the bundled target:
  // +23 MB). On by default; made and kept fresh as the bfloat16 copies are (the same caveat on
  // writes through shared storage).
  void UsePackedWeights(bool on) {
    packed_requested_ = on;
    packed_copies_.clear();
  }
  bool packed_weights() const;

  // y [rows, n] = x [rows, k] @ weight[:n]^T (+ bias) (+ residual): the first n rows of k values
  // of `weight` (it may have more). Int8MatmulRaw or SmallMatmulBf16Raw on a copy (see
  // UseDraftMatmul), else PackedMatmulRaw on a packed copy (UsePackedWeights), else SmallMatmulRaw
  // on the weights themselves; any number of rows, in blocks of kSmallMatmulMaxRows (the
  // kernels' most).
  void Matmul(const float* x, int64_t rows, int64_t k, const at::Tensor& weight, int64_t n,
              const float* bias, const float* residual, float* y);

 private:
  // Matmul of at most kSmallMatmulMaxRows rows.
  void MatmulBlock(const float* x, int64_t rows, int64_t k, const at::Tensor& weight, int64_t n,
                   const float* bias, const float* residual, float* y);
  // A copy of a weight in another layout, remade when the weight's storage or version changes.
  struct WeightCopy {
    at::Tensor source;  // keeps the weight's storage alive, so a new one cannot reuse its address
    const void* data = nullptr;
    uint32_t version = 0;
    at::Tensor copy;
  };
  using WeightCopies = std::unordered_map<const void*, WeightCopy>;  // by the weight's TensorImpl
  // The entry of `weight` in `copies`, with `make` run when it is missing or stale.
  template <typename Make>
  const at::Tensor& CopyOf(WeightCopies& copies, const at::Tensor& weight, const Make& make);
  const uint16_t* Bf16WeightsOf(const at::Tensor& weight);
  // The rows of `weight` as [rows, k] when they are whole groups of 16 outputs (so a copy of all
  // of them serves a product with its first n), else 0 (the caller reads the weight itself).
  static int64_t GroupedRows(const at::Tensor& weight, int64_t n, int64_t k);
  // The int8 copy of all of `weight`'s rows, for a product with its first n; null panels when
  // its rows are not whole groups of 16.
  struct Int8Weights {
    const int8_t* panels = nullptr;  // PackInt8MatmulWeights' layout
    const float* scales = nullptr;   // one per row
  };
  Int8Weights Int8WeightsOf(const at::Tensor& weight, int64_t n, int64_t k);
  // The packed copy of all of `weight`'s rows, for a product with its first n; nullptr when
  // its rows are not whole groups of 16.
  const float* PackedWeightsOf(const at::Tensor& weight, int64_t n, int64_t k);

  DraftMatmul draft_matmul_requested_ = DraftMatmul::kFloat32;
  WeightCopies bf16_copies_;  // [n, k] bfloat16
  WeightCopies int8_copies_;  // rows float32 scales, then n * k int8 (PackInt8MatmulWeights)
  bool packed_requested_ = true;
  WeightCopies packed_copies_;  // n * k float32 panels (PackMatmulWeights)
  ModelConfig config_;
  using Scratch = CpuScratch;
  // For kSmallMatmulMaxRows rows: the residual stream before and after attention, a normed copy,
  // the fused projections' outputs, rotated queries, attention output, activation, the logit
  // rows and a restricted head's scores.
  Scratch x_, h_, normed_, qkv_, q_normed_, k_normed_, q_rot_, attn_, gate_up_, act_;
  Scratch head_rows_, head_out_;
  HiddenCapturePool capture_pool_;  // Run's captured hidden states
};

}  // namespace specula
