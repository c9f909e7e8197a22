// Buffers for the hidden states a CPU forward captures (CpuForward::Run), recycled once nothing
// holds them any more.
//
// A hidden-state drafter's sequences keep each step's captured states until their next catch-up
// (HiddenBacklog::AppendShared), so a fresh buffer per forward was allocated while the last few
// dozen were still held: at batch 1 the allocation (~1.2 us, its metadata cold after the forward),
// a select per layer (~0.5 us each through the dispatcher) and the copies into new pages took
// ~6 us of a 0.45 ms decode step with SpecFormer's four layers, whether or not it drafted. A
// recycled buffer comes with its per-layer views made once, and its pages stay mapped.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace specula {

class HiddenCapturePool {
 public:
  // Buffers of up to max_rows rows (a decode step's, a few verified drafts': what backlogs keep)
  // are kept in a ring, up to max_bytes in all; beyond it a capture gets a buffer of its own, as
  // without the pool. A capture of more rows (a prompt chunk, a large batch's decode step: the
  // backlogs copy its rows out at once) reuses one buffer sized for the most rows seen, as long
  // as nothing holds it: a new one each time was a fresh allocation of up to a few MB, its pages
  // faulted in.
  explicit HiddenCapturePool(int64_t max_rows = 16, int64_t max_bytes = int64_t{64} << 20)
      : max_rows_(max_rows), max_bytes_(max_bytes) {}

  struct Capture {
    float* data = nullptr;           // layer l's rows at data + l * layer_stride
    int64_t layer_stride = 0;        // floats
    std::vector<at::Tensor> layers;  // [rows, width] float32 contiguous views, one per layer
  };
  // A buffer of `layers` x [rows, width] float32 that nothing else holds: a recycled one if one
  // is free (nothing holds its views or a tensor made from them), else a new one. The caller
  // writes it before handing the views out.
  Capture Acquire(int64_t layers, int64_t rows, int64_t width);

  size_t buffers() const { return entries_.size(); }
  int64_t bytes() const { return bytes_; }

 private:
  struct Entry {
    at::Tensor base;                // [layers, rows, width]
    std::vector<at::Tensor> views;  // base.select(0, l)
  };
  // Nothing but the entry holds its storage or views.
  static bool Free(const Entry& e);
  static Entry Make(int64_t layers, int64_t rows, int64_t width);

  Capture AcquireLarge(int64_t layers, int64_t rows, int64_t width);

  int64_t max_rows_, max_bytes_;
  int64_t bytes_ = 0;  // of the ring's buffers
  std::vector<Entry> entries_;
  at::Tensor large_;  // [layers, most rows seen, width], for captures past max_rows
  // Where the next search starts: buffers are let go of in about the order they were handed out,
  // so the one after the last handed out is the likeliest to be free.
  size_t next_ = 0;
};

}  // namespace specula
