#include "common/model/hidden_capture_pool.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace specula {

namespace {

// Entries looked at from the cursor for a free one of the shape wanted: the free one is normally
// the first (buffers are let go of in about the order they were handed out); each look reads a
// few reference counts the forward has evicted from the caches.
constexpr size_t kSearch = 8;

}  // namespace

bool HiddenCapturePool::Free(const Entry& e) {
  // Every tensor on the buffer holds its storage: the base and the entry's views, and anything
  // else is a holder (a tensor made from a view); a holder of a view itself holds that view.
  // (The base is never handed out; with autograd on, the views hold it as their base.)
  for (const at::Tensor& v : e.views) {
    if (v.use_count() != 1) return false;
  }
  return e.base.storage().use_count() == 1 + e.views.size();
}

HiddenCapturePool::Entry HiddenCapturePool::Make(int64_t layers, int64_t rows, int64_t width) {
  Entry e;
  e.base = at::empty({layers, rows, width}, at::kFloat);
  e.views.reserve(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) e.views.push_back(e.base.select(0, l));
  return e;
}

HiddenCapturePool::Capture HiddenCapturePool::Acquire(int64_t layers, int64_t rows, int64_t width) {
  auto hand_out = [](const Entry& e) {
    return Capture{.data = e.base.data_ptr<float>(),
                   .layer_stride = e.base.size(1) * e.base.size(2),
                   .layers = e.views};
  };
  const int64_t bytes = layers * rows * width * static_cast<int64_t>(sizeof(float));
  if (rows > max_rows_) return AcquireLarge(layers, rows, width);
  const size_t n = entries_.size();
  size_t other = n;  // the first free buffer of another shape
  for (size_t k = 0; k < std::min(n, kSearch); ++k) {
    const size_t i = (next_ + k) % n;
    const Entry& e = entries_[i];
    if (!Free(e)) continue;
    if (e.base.size(0) == layers && e.base.size(1) == rows && e.base.size(2) == width) {
      next_ = (i + 1) % n;
      return hand_out(e);
    }
    if (other == n) other = i;
  }
  if (other < n) {
    // Made again in this shape: a free buffer is never left behind for a new one (batches
    // change size, drafts come and go, and the ring would grow with buffers of old shapes).
    Entry& e = entries_[other];
    bytes_ += bytes - e.base.numel() * static_cast<int64_t>(sizeof(float));
    e = Make(layers, rows, width);
    next_ = (other + 1) % n;
    return hand_out(e);
  }
  if (bytes_ + bytes <= max_bytes_) {
    // Inserted at the cursor, so that the ring stays in the order buffers were handed out.
    const size_t at = n == 0 ? 0 : next_ % n;
    entries_.insert(entries_.begin() + static_cast<std::ptrdiff_t>(at), Make(layers, rows, width));
    bytes_ += bytes;
    next_ = (at + 1) % entries_.size();
    return hand_out(entries_[at]);
  }
  return hand_out(Make(layers, rows, width));
}

HiddenCapturePool::Capture HiddenCapturePool::AcquireLarge(int64_t layers, int64_t rows,
                                                           int64_t width) {
  // Reused only if nothing but large_ holds its storage (every view handed out was let go of).
  const bool same = large_.defined() && large_.size(0) == layers && large_.size(2) == width;
  if (!same || large_.storage().use_count() != 1 || large_.size(1) < rows) {
    const int64_t capacity = same ? std::max(rows, large_.size(1)) : rows;
    large_ = at::empty({layers, capacity, width}, at::kFloat);
  }
  Capture c{.data = large_.data_ptr<float>(), .layer_stride = large_.size(1) * width};
  c.layers.reserve(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) c.layers.push_back(large_.select(0, l).narrow(0, 0, rows));
  return c;
}

}  // namespace specula
