// Beagle's serving forwards for float32 on the CPU without LibTorch ops, as common/model/
// cpu_forward.h does for the target and SpecFormerCpuForward for SpecFormer: the true states'
// keys and values (Observe), and a drafting depth (query, cross attention over the true-state cache
// and the path's drafted states, output block, head scores), each the module's computation on raw
// pointers into its current weights and scratch kept between calls. The module ran ~50 LibTorch
// ops per depth (dispatch, a new tensor each, RoPE tables rebuilt per call, frontiers padded to
// the widest): a Propose of 4 nodes took 0.44 ms at batch 1 and 1.06 ms at batch 4, against
// 0.16 and 0.41 here (docs/BENCHMARKS.md). Its matmuls run on CpuForward (packed, bfloat16 or
// int8 copies: UseDraftMatmul), RoPE on the kernels' RotateRow rather than the module's tensor ops,
// and log-softmax sums in the kernels' exponential: the same values within float rounding
// (tests/drafters/beagle_drafter_test.cc). Include only from .cc files.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "common/model/cpu_forward.h"
#include "common/model/cpu_kernels.h"

namespace specula {

class BeagleImpl;
class PagedAttentionLayout;

class BeagleCpuForward {
 public:
  // Reads the module's geometry and RoPE (its tables are built here for every position).
  explicit BeagleCpuForward(BeagleImpl& module);

  // Whether the forwards can run on `module` now: float32 contiguous CPU weights, the MLP's
  // projections fused, widths the kernels take. Any number of rows.
  bool Applies(BeagleImpl& module) const;
  // Positions the RoPE tables cover.
  int64_t max_positions() const { return cos_.size(0); }

  // KeysValues: the keys (RoPE at `positions`) and values of `rows` states [rows, d] written to
  // `slots` of the [num_slots, kv heads, head_dim] caches.
  void KeysValues(BeagleImpl& module, const float* states, int64_t rows, const int64_t* positions,
                  const int64_t* slots, float* key_cache, float* value_cache, int64_t num_slots);
  // One drafting depth: the queries of `tokens` at `positions` attend to the true-state cache as
  // `layout` reads it (and each to its own drafted states, `row_keys`, may be null), then the
  // output block: h [rows, d], valid until the next call.
  const float* Draft(BeagleImpl& module, const int64_t* tokens, const int64_t* positions,
                     int64_t rows, const PagedAttentionLayout& layout, const float* key_cache,
                     const float* value_cache, const RowKeysRaw* row_keys);
  // The head's logits of `rows` rows h [rows, d] over the tokens it ranks (the draft
  // vocabulary's, in its order, or all): [rows, module.head_size()], valid until the next call.
  const float* Scores(BeagleImpl& module, const float* h, int64_t rows);

  // CpuForward::UseDraftMatmul and UsePackedWeights for every matmul.
  void UseDraftMatmul(DraftMatmul matmul) { layers_.UseDraftMatmul(matmul); }
  DraftMatmul draft_matmul() const { return layers_.draft_matmul(); }
  void UsePackedWeights(bool on) { layers_.UsePackedWeights(on); }

 private:
  at::Tensor cos_, sin_;  // RoPE rows for every position, as the module's RopeFor computes them
  CpuScratch normed_, keys_, values_, residual_, q_, q_rot_, attn_, y_, h_, scores_;
  CpuForward layers_;
};

}  // namespace specula
