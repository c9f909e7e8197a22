// The target's hidden states a sequence's drafter has not observed yet (deferred observation:
// a sequence the draft budget leaves at 0 nodes is caught up only before its next draft), one
// [rows, hidden] tensor per drafter layer.
//
// Rows are appended after every target step, for every speculating sequence, so appending must
// cost next to nothing: on the CPU, rows are memcpy'd into a per-layer buffer that grows by
// doubling (a LibTorch op per sequence per step, as before, cost ~90 us per sequence in the
// decode step of the 6M model at batch 16: dispatch, allocation and thread-pool wake-ups, 44% of
// the step). On a device the rows stay device tensors: the engine gathers every sequence's rows of
// a step with one index_select per layer (GatherStepRows) and each sequence keeps views of its
// share (AppendGathered), caught up with one cat. A per-sequence gather cost an index upload (a
// synchronous host-to-device copy) and one kernel per layer per sequence: on an H100, hidden-state
// drafters ran at 0.69-0.78x of no speculation at batch 64 with a zero draft budget.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace specula {

class HiddenBacklog {
 public:
  // Appends rows [row0, row_end) of each layer's packed step tensor ([step rows, hidden]).
  void AppendRange(const std::vector<at::Tensor>& layers, int64_t row0, int64_t row_end);
  // Appends the given rows of each layer's packed step tensor, in order.
  void AppendRows(const std::vector<at::Tensor>& layers, const std::vector<int64_t>& rows);
  // Appends one step's rows of this sequence, one [n, hidden] tensor per layer, as they are (views
  // of GatherStepRows' tensors; on the CPU they are copied into the buffers). Every kMaxChunks
  // appends the chunks are joined into one, so that a sequence that does not draft for a long time
  // keeps its own rows alive, not hundreds of whole-batch gathers.
  void AppendGathered(std::vector<at::Tensor> rows);
  static constexpr size_t kMaxChunks = 32;
  // Every row appended since the last Take, one [rows, hidden] tensor per layer (empty if no
  // rows), and a fresh start.
  std::vector<at::Tensor> Take();
  void Clear();
  int64_t rows() const { return rows_; }
  // Tensors held per layer (1 on the CPU path; grows by one per device append until compacted).
  size_t chunks() const { return chunks_.empty() ? (rows_ > 0 ? 1 : 0) : chunks_.size(); }

 private:
  bool UseBuffers(const std::vector<at::Tensor>& layers) const;
  void Compact();
  void Reserve(const std::vector<at::Tensor>& layers, int64_t rows);

  int64_t rows_ = 0;
  // CPU: one growing buffer per layer, the first rows_ rows in use. Take hands the buffers over
  // (the drafter may keep what it observes), so they are never written after a Take.
  std::vector<at::Tensor> buffers_;
  // Elsewhere: per append, one tensor per layer.
  std::vector<std::vector<at::Tensor>> chunks_;
};

// One step's rows of several sequences at once: `rows_per_seq[i]` are sequence i's row indices
// into the step's packed hidden states `layers` ([step rows, hidden] each). One index upload and
// one index_select per layer for the whole step; result[i][k] is a [rows_per_seq[i].size(),
// hidden] view of layer k's gather.
std::vector<std::vector<at::Tensor>> GatherStepRows(
    const std::vector<at::Tensor>& layers, const std::vector<std::vector<int64_t>>& rows_per_seq);

}  // namespace specula
