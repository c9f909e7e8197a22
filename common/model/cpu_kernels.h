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
// multiple of 16: every weight row is read once for all rows. BLAS sgemm packs the whole weight
// matrix per call, which at a few rows costs more than the product (decode and short verify
// chunks are bound by reading the weights).
inline constexpr int64_t kSmallMatmulMaxRows = 8;
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

// Attention of every row of `layout` over its sequence's cache where the blocks lie: q [N, nh, hd]
// (contiguous), caches [slots, nkv, hd] already holding this forward's keys/values. Grouped-query
// heads share each key read; online softmax per chunk of keys; rows x kv heads run in parallel.
// Returns [N, nh * hd].
at::Tensor PagedAttentionCpu(const at::Tensor& q, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const PagedAttentionLayout& layout);

}  // namespace specula
