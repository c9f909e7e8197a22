// The target's hidden states a sequence's drafter has not observed yet (deferred observation:
// a sequence the draft budget leaves at 0 nodes is caught up only before its next draft), one
// [rows, hidden] tensor per drafter layer.
//
// Rows are appended after every target step, for every speculating sequence, so appending must
// cost next to nothing. On the CPU, rows are memcpy'd into a per-layer buffer that grows by
// doubling (a LibTorch op per sequence per step, as before, cost ~90 us per sequence in the
// decode step of the 6M model at batch 16: dispatch, allocation and thread-pool wake-ups, 44% of
// the step). The first buffer is sized for ExpectRows, and a buffer the drafter no longer holds
// after a Take is written again, so a sequence's rows are normally not copied twice: growing
// (allocation, page faults, a copy of the rows so far) was 8 of the 19 ms a 288-step batch-16
// run spent appending SpecFormer's four layers. On a device the engine stores a whole step's rows
// in the shared HiddenRowStore at once and the backlog keeps the slot numbers (AppendSlots): no op
// per sequence until it drafts.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/spec/hidden_row_store.h"

namespace specula {

class HiddenBacklog {
 public:
  HiddenBacklog() = default;
  ~HiddenBacklog() { Clear(); }
  HiddenBacklog(const HiddenBacklog&) = delete;
  HiddenBacklog& operator=(const HiddenBacklog&) = delete;

  // Appends rows [row0, row_end) of each layer's packed step tensor ([step rows, hidden], on the
  // CPU), copied into the buffers.
  void AppendRange(const std::vector<at::Tensor>& layers, int64_t row0, int64_t row_end);
  // Appends the given rows of each layer's packed step tensor, in order.
  void AppendRows(const std::vector<at::Tensor>& layers, const std::vector<int64_t>& rows);
  // The same rows without copying them: the backlog keeps the step's tensors (which nothing may
  // write again; the target's captured states are fresh each step, and the sequences of a step
  // share one set) until it is taken, and copies its rows out then. A decode step's rows were
  // copied into each sequence's buffer right after the forward had streamed the weights through
  // the caches: 2.8% of the engine thread at batch 4 for SpecFormer's four layers (perf), mostly
  // those copies' misses, for rows a sequence at 0 nodes reads only at its next probe. A later
  // AppendRange or AppendRows copies the shared rows into the buffers first (order is kept).
  using SharedLayers = std::shared_ptr<const std::vector<at::Tensor>>;
  void AppendShared(SharedLayers layers, const std::vector<int64_t>& rows);
  // Appends rows held in `store` (which must outlive the backlog's rows): `slots`, of the model
  // layers `layer_ids` (the drafter's, in its order). Not mixed with the other appends between
  // Takes. The backlog frees the slots when it is taken, cleared or destroyed.
  void AppendSlots(HiddenRowStore* store, const std::vector<int64_t>& layer_ids,
                   const std::vector<int64_t>& slots);
  // The rows the backlog will probably hold at most: `first` until the first Take (the prompt
  // and what may be generated before the drafter catches up), `later` between later Takes.
  // Buffers are allocated that size (at least the rows appended), and a buffer larger than
  // twice `later` is let go at a Take, so a long prompt's rows are not kept for the sequence's
  // life.
  void ExpectRows(int64_t first, int64_t later) {
    expected_first_ = first;
    expected_later_ = later;
  }
  // Every row appended since the last Take, one [rows, hidden] tensor per layer (empty if no
  // rows), and a fresh start. Shared rows are copied into the buffers here.
  std::vector<at::Tensor> Take();
  // Lets go of all but the newest `keep` rows (a drafter that restarts from a sequence's recent
  // tokens reads no older ones, SpecEngineOptions::drafter_context).
  void KeepNewest(int64_t keep);
  void Clear();
  int64_t rows() const { return rows_; }

 private:
  void Reserve(const std::vector<at::Tensor>& layers, int64_t rows);
  // Copies the shared rows into the buffers (before rows are copied after them, and at a Take).
  void MaterializeShared();

  int64_t rows_ = 0;
  int64_t expected_first_ = 0;
  int64_t expected_later_ = 0;
  // CPU: one growing buffer per layer, the first rows_ rows in use. Take hands views of the
  // buffers over (the drafter may keep what it observes), so a buffer is written after a Take
  // only once no view of it is left (its storage referenced by the buffer alone).
  std::vector<at::Tensor> buffers_;
  bool taken_ = false;      // buffers_ were handed over by the last Take
  bool allocated_ = false;  // buffers were allocated since the last Clear (`first` applied)
  // AppendShared: rows of steps' tensors, after the buffers' rows_ - shared_.size().
  struct SharedRow {
    SharedLayers layers;
    int64_t row = 0;
  };
  std::vector<SharedRow> shared_;
  // AppendSlots: rows in a shared store.
  HiddenRowStore* store_ = nullptr;
  std::vector<int64_t> store_layers_;
  std::vector<int64_t> slots_;
};

}  // namespace specula
