// SpecFormer's serving forwards for float32 on the CPU without LibTorch ops, as
// common/model/cpu_forward.h does for the target: the context layer over a step's observed rows
// (Hook + Context) and the draft block over its slots with the head (Slots + Logits), each the
// module's kernels in the module's order on raw pointers into its current weights and scratch
// kept between calls, so results are bitwise the module's (tests/drafters/
// specformer_drafter_test.cc). The module's ~25 (context) and ~50 (draft) LibTorch calls per step
// were a quarter of SpecFormer's drafting time at batch 1 (docs/BENCHMARKS.md). Include only
// from .cc files.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "common/model/attention_inputs.h"
#include "common/model/cpu_forward.h"

namespace specula {

class PagedAttentionLayout;
class SpecFormerImpl;

class SpecFormerCpuForward {
 public:
  // Reads the module's config and RoPE (its tables are built here, as RopeFor builds them).
  explicit SpecFormerCpuForward(SpecFormerImpl& module);

  // Whether the forwards can take `rows` rows of `module` now: float32 CPU weights, fused
  // projections, at most kSmallMatmulMaxRows rows.
  bool Applies(SpecFormerImpl& module, int64_t rows) const;

  // Hook + Context: hidden[k] the hooked layer k's states of the N rows (one [n_i, d] float32
  // tensor per observation i, in row order); next_tokens [N] (with pending_token); layout and kv:
  // the drafter's context cache, where the rows' keys and values are written. -> c [N, d].
  at::Tensor Context(SpecFormerImpl& module, const std::vector<std::vector<at::Tensor>>& hidden,
                     const std::vector<int64_t>& next_tokens, const PagedAttentionLayout& layout,
                     LayerKvCache& kv);
  // Slots + Logits: c [M, d] (each sequence's last context output) -> logits [M, n, V] float32 of
  // its first n = min(slots, l_d) slots.
  at::Tensor DraftLogits(SpecFormerImpl& module, const std::vector<const float*>& c, int64_t slots);
  // Every matmul on bfloat16 or int8 copies of the weights (CpuForward::UseDraftMatmul):
  // results no longer bitwise the module's.
  void UseDraftMatmul(DraftMatmul matmul) { layers_.UseDraftMatmul(matmul); }
  // Every float32 matmul on packed copies of the weights (CpuForward::UsePackedWeights).
  void UsePackedWeights(bool on) { layers_.UsePackedWeights(on); }

 private:
  using Scratch = CpuScratch;
  // The draft block's layers on x [rows, d] in place; `layout` lays its rows out over `cache`.
  void DraftBlock(SpecFormerImpl& module, float* x, int64_t rows,
                  const PagedAttentionLayout& layout);

  at::Tensor cos_, sin_;  // RoPE rows for every position, as RopeFor computes them
  Scratch hooked_, x_, normed_, keys_, values_;
  // The layers' attention and MLP blocks and the target's head (of the layers' geometry).
  CpuForward layers_;
};

}  // namespace specula
