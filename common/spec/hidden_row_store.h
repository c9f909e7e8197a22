// The target's hidden-state rows that drafters have not observed yet, for every sequence of an
// engine at once: one [capacity, hidden] tensor per model layer, rows handed out as slots.
//
// A step stores the rows of every sequence it captured with one index upload and two ops per
// layer (Put), whatever the batch size; a sequence keeps only its slot numbers (host integers) and
// reads its rows back with one gather per layer when its drafter catches up (Get). On a GPU the
// step is bound by the host launching ops: keeping each sequence's rows as tensors of its own cost
// a few ops per sequence per step (views of a whole-step gather, joined every 32 steps), which at
// batch 64 made hidden-state drafters that drafted nothing 0.76x of no speculation on an H100.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

namespace specula {

class HiddenRowStore {
 public:
  // Copies rows `rows` of each step tensor `layers[k]` ([step rows, hidden], the hidden states of
  // model layer `layer_ids[k]`) into free slots and returns them, in the order of `rows`. Every
  // slot holds a row of each layer given. Throws what LibTorch throws (nothing is kept then).
  std::vector<int64_t> Put(const std::vector<int64_t>& layer_ids,
                           const std::vector<at::Tensor>& layers, const std::vector<int64_t>& rows);
  // The slots' rows of each of `layer_ids` ([slots, hidden] each, in order); the slots stay held.
  std::vector<at::Tensor> Get(const std::vector<int64_t>& layer_ids,
                              const std::vector<int64_t>& slots) const;
  // Returns slots for reuse. When none is held any more the storage is released.
  void Free(const std::vector<int64_t>& slots);

  int64_t held() const { return held_; }
  int64_t capacity() const { return capacity_; }

 private:
  std::vector<int64_t> Allocate(int64_t n);
  void Grow(int64_t rows);

  std::map<int64_t, at::Tensor> layers_;  // model layer -> [capacity, hidden]
  int64_t capacity_ = 0;
  int64_t end_ = 0;   // slots [0, end_) were handed out at least once
  int64_t held_ = 0;  // slots in use
  std::vector<int64_t> free_;
};

}  // namespace specula
