// The target's hidden states a sequence's drafter has not observed yet (deferred observation:
// a sequence the draft budget leaves at 0 nodes is caught up only before its next draft), one
// [rows, hidden] tensor per drafter layer.
//
// Rows are appended after every target step, for every speculating sequence, so appending must
// cost next to nothing: on the CPU, rows are memcpy'd into a per-layer buffer that grows by
// doubling (a LibTorch op per sequence per step, as before, cost ~90 us per sequence in the
// decode step of the 6M model at batch 16: dispatch, allocation and thread-pool wake-ups, 44% of
// the step). On a device the rows stay device tensors (a gather per step, caught up with one cat).
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
  // Every row appended since the last Take, one [rows, hidden] tensor per layer (empty if no
  // rows), and a fresh start.
  std::vector<at::Tensor> Take();
  void Clear();
  int64_t rows() const { return rows_; }

 private:
  bool UseBuffers(const std::vector<at::Tensor>& layers) const;
  void Reserve(const std::vector<at::Tensor>& layers, int64_t rows);

  int64_t rows_ = 0;
  // CPU: one growing buffer per layer, the first rows_ rows in use. Take hands the buffers over
  // (the drafter may keep what it observes), so they are never written after a Take.
  std::vector<at::Tensor> buffers_;
  // Elsewhere: per append, one tensor per layer.
  std::vector<std::vector<at::Tensor>> chunks_;
};

}  // namespace specula
