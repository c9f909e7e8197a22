// Hand-written float32 CPU kernels of the serving forward: what LibTorch would run as several small
// ops (each with dispatch overhead and a temporary) done in one pass. Inputs are rows with a last
// dimension of stride 1; callers check `CpuKernelsApply` and otherwise use the LibTorch path, which
// stays the reference the tests compare against.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace specula {

class PagedAttentionLayout;

// True for float32 CPU tensors: the only case these kernels handle.
bool CpuKernelsApply(const at::Tensor& t);

// x [M, k] @ weight[n, k]^T (+ bias [n]) (+ *residual [M, n]) for M <= kSmallMatmulMaxRows and k a
// multiple of 16: every weight row is read once for all rows (blocks of 8 rows over cache-sized
// tiles of weight rows), on every core. BLAS sgemm packs the whole weight matrix per call, which
// at a few rows costs more than the product, and OpenBLAS's single-threaded path for 9-32 rows
// was 3x slower than this kernel at 8 (measured: batch 1, 9 rows 3.6 ms vs 1.3 ms, with SSE3
// kernels). Against OpenBLAS's AVX-512 sgemm, since this kernel prefetches its weights, it wins up
// to 128 rows and loses from 256 (target forwards, min ms: 33 rows 2.36 vs 3.57, 64 rows 4.57 vs
// 5.92, 128 rows 9.94 vs 10.39, 256 rows 18.5 vs 16.5; batch 64 decoding at context 128 6.20 vs
// 8.56; docs/BENCHMARKS.md), so the bound is 128.
inline constexpr int64_t kSmallMatmulMaxRows = 128;
bool SmallMatmulApplies(const at::Tensor& x, const at::Tensor& weight);
at::Tensor SmallMatmulCpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                          const at::Tensor* residual);

// x [N, d] -> weight * x / sqrt(mean(x^2) + eps), computed in float32 as Hugging Face does.
at::Tensor RmsNormCpu(const at::Tensor& x, const at::Tensor& weight, double eps);

// gate_up [..., 2f] (gate then up, as one matmul produces them) -> silu(gate) * up [..., f].
at::Tensor SiluMulCpu(const at::Tensor& gate_up);

// Rotates q and k by RoPE (cos/sin [N, head_dim], HF's rotate_half convention), writes the rotated
// keys and the values of row i to cache slot write_slots[i], and returns the rotated queries
// [N, num_heads, head_dim]. q [N, nh, hd], k/v [N, nkv, hd] may be strided views (e.g. of one
// fused qkv matmul's output) as long as head_dim has stride 1 and heads are hd apart.
at::Tensor RopeAndCacheCpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& cos, const at::Tensor& sin,
                           const std::vector<int64_t>& write_slots, at::Tensor& key_cache,
                           at::Tensor& value_cache);

// Keys and values that belong to single rows rather than to a sequence's cache: [N, D, nkv, hd],
// of which row r sees the first counts[r] (e.g. the drafted states on a Beagle query's own path).
struct RowKeys {
  at::Tensor keys, values;
  std::vector<int32_t> counts;  // [N], each in [0, D]
};

// Attention of every row of `layout` over its sequence's cache where the blocks lie: q [N, nh, hd]
// (contiguous), caches [slots, nkv, hd] already holding this forward's keys/values; with
// `row_keys`, each row also attends to its own keys (one softmax over both). Grouped-query heads
// share each key read; online softmax per chunk of keys; runs of rows run in parallel, split by kv
// heads when there are few (batch 1), with the same values as on one thread. A row
// that sees no key at all gets zeros. Returns [N, nh * hd].
at::Tensor PagedAttentionCpu(const at::Tensor& q, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const PagedAttentionLayout& layout,
                             const RowKeys* row_keys = nullptr);

// Raw forms of the kernels above, for callers that keep their own buffers (CpuForward): the same
// computations, so the same results, without a tensor per call. Rows have a stride of their
// width unless a stride is given.

// y [rows, n] = x [rows, k] @ weight [n, k]^T (+ bias [n]) (+ residual [rows, n]); rows in
// [1, kSmallMatmulMaxRows], k a multiple of 16.
void SmallMatmulRaw(const float* x, int64_t rows, int64_t k, const float* weight, int64_t n,
                    const float* bias, const float* residual, float* y);
// Whether SmallMatmulBf16Raw runs here: this build has it (x86-64, GCC) and the CPU has
// AVX512-BF16 (its dot product of bfloat16 pairs into float32 lanes: twice the multiply-adds of
// a float32 FMA per instruction and half the weight bytes).
bool Bf16MatmulRuns();
// SmallMatmulRaw with bfloat16 weights ([n, k] raw bits, as at::kBFloat16 stores them) and x
// rounded to bfloat16 (nearest even): products of bfloat16 pairs summed in float32. Not the
// float32 product (8 mantissa bits per operand): for drafters, whose outputs the target
// verifies, not for a target. k a multiple of 32, rows in [1, kSmallMatmulMaxRows]; only where
// Bf16MatmulRuns().
void SmallMatmulBf16Raw(const float* x, int64_t rows, int64_t k, const uint16_t* weight, int64_t n,
                        const float* bias, const float* residual, float* y);
// SmallMatmulRaw on weights packed once into panels (PackMatmulWeights): bitwise its results
// (each output's products summed in the same order). The panels turn SmallMatmulRaw's 16-lane
// dot products into outer products over 16 outputs, so a verified draft's rows share each weight
// load without a shuffle per output: the bundled target's forward of 1-16 rows 1.1-1.3x faster,
// its matmuls then reading the weights about as fast as one row does (docs/BENCHMARKS.md). Only
// where PackedMatmulRuns() (AVX-512, as SmallMatmulRaw's tiles): it matches SmallMatmulRaw's
// AVX-512 build, not the others'.
bool PackedMatmulRuns();
// weight [n, k] (n and k multiples of 16) -> packed, n * k floats: for output group g (outputs
// 16 g ... 16 g + 15) and input lane j, the k / 16 vectors of w[16 g + c][16 i + j] over c.
void PackMatmulWeights(const float* weight, int64_t n, int64_t k, float* packed);
// y [rows, n] = x [rows, k] @ weight^T (+ bias [n]) (+ residual [rows, n]) from the packed
// weight; rows in [1, kSmallMatmulMaxRows], n and k multiples of 16.
void PackedMatmulRaw(const float* x, int64_t rows, int64_t k, const float* packed, int64_t n,
                     const float* bias, const float* residual, float* y);
// Weight-only int8 for drafters: each output row of the weight scaled by its largest magnitude
// to [-127, 127] (symmetric, per output), packed into outer-product panels of 16 outputs, and
// multiplied as float32 (x is not quantised). A quarter of float32's weight bytes: a draft LM's
// one-row step, bound by streaming its weights from L3 after the target's forward evicted them
// from L2, costs about what its multiply-adds do. Not the float32 product (~8 bits per weight):
// for drafters, whose outputs the target verifies. Only where Int8MatmulRuns() (AVX-512).
bool Int8MatmulRuns();
// weight [n, k] (n a multiple of 16, k of 4) -> packed (n * k int8: group g's k vectors of
// q[16 g + c][p] over c, contiguous in p) and scales [n] (w ~= q * scale; 0 for a zero row).
void PackInt8MatmulWeights(const float* weight, int64_t n, int64_t k, int8_t* packed,
                           float* scales);
// y [rows, n] = x [rows, k] @ (q * scale)^T (+ bias [n]) (+ residual [rows, n]) from
// PackInt8MatmulWeights' output (its first n rows); rows in [1, kSmallMatmulMaxRows].
void Int8MatmulRaw(const float* x, int64_t rows, int64_t k, const int8_t* packed,
                   const float* scales, int64_t n, const float* bias, const float* residual,
                   float* y);
// sum_i exp(x[i] - shift) for x[i] <= shift (a row's largest value), in lane-parallel float
// sums of a ~2-ulp exponential: the softmax denominators drafters take over a 4,096-token row at
// every depth (std::exp per logit, summed in double, was ~14% of a draft LM's step). -inf adds
// ~1e-38 (the exponential's floor at exp(-87)); NaN propagates.
float SumExpBelow(const float* x, int64_t n, float shift);
// out[i] = exp(x[i] - shift), exactly 0 where x[i] is -inf; returns their sum as SumExpBelow.
float ExpBelowRaw(const float* x, int64_t n, float shift, float* out);
void RmsNormRaw(const float* x, const float* weight, float* out, int64_t rows, int64_t d,
                double eps);
void SiluMulRaw(const float* gate_up, float* out, int64_t rows, int64_t f);

// One forward's rows for RopeAndCacheRaw: q/k/v row i at q + i * q_stride (heads q_head_stride
// apart, each head_dim contiguous floats), rotated by the cos/sin table rows cos_row[i].
struct RopeRows {
  const float* q;
  const float* k;
  const float* v;
  int64_t q_stride, k_stride, v_stride;
  int64_t q_head_stride, k_head_stride, v_head_stride;
  int64_t rows, num_heads, num_kv_heads, head_dim;
  const float* cos;  // [table rows, head_dim]
  const float* sin;
  const int64_t* cos_row;      // [rows]
  const int64_t* write_slots;  // [rows], each in [0, num_slots)
};
// Writes the rotated keys and the values to their slots of the [num_slots, nkv, hd] caches and
// the rotated queries to q_out [rows, nh, hd]. With num_heads 0 only the keys and values (q and
// q_out are not read).
void RopeAndCacheRaw(const RopeRows& rows, int64_t num_slots, float* key_cache, float* value_cache,
                     float* q_out);
// Rotates `rows` rows of `heads` heads by RoPE (HF's rotate_half, as RopeAndCacheRaw): row i's
// head h at x + i * stride + h * head_stride (head_dim contiguous floats), by the table rows
// cos_row[i] of cos/sin [table rows, head_dim], into out [rows, heads, head_dim].
void RopeRaw(const float* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_stride,
             int64_t head_dim, const float* cos, const float* sin, const int64_t* cos_row,
             float* out);

// RowKeys as raw rows: keys and values [rows, row_keys, nkv, hd], of which row r sees the first
// counts[r] (each in [0, row_keys]).
struct RowKeysRaw {
  const float* keys;
  const float* values;
  int64_t row_keys;
  const int32_t* counts;
};
// PagedAttentionCpu on raw rows: q [rows, nh, hd] contiguous, out [rows, nh * hd]; row_keys may
// be null.
void PagedAttentionRaw(const float* q, int64_t rows, int64_t num_heads, int64_t head_dim,
                       int64_t num_kv_heads, const float* key_cache, const float* value_cache,
                       const PagedAttentionLayout& layout, float* out,
                       const RowKeysRaw* row_keys = nullptr);

}  // namespace specula
