#include "common/spec/hidden_backlog.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace specula {

namespace {

// The step tensors as contiguous CPU [rows, hidden] tensors (views unless they are strided), so
// that rows can be memcpy'd.
std::vector<at::Tensor> HostRows(const std::vector<at::Tensor>& layers) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : layers) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 2,
                "HiddenBacklog: rows are appended from CPU [rows, hidden] tensors (a device's "
                "go to the HiddenRowStore)");
    out.push_back(t.is_contiguous() ? t : t.contiguous());
  }
  return out;
}

}  // namespace

void HiddenBacklog::Reserve(const std::vector<at::Tensor>& layers, int64_t rows) {
  if (buffers_.size() != layers.size()) buffers_.assign(layers.size(), at::Tensor());
  if (taken_) {
    // Reuse what the drafter let go of (it copied what it observed); a buffer it still views is
    // left to it.
    for (size_t k = 0; k < buffers_.size(); ++k) {
      at::Tensor& buf = buffers_[k];
      if (buf.defined() && buf.storage().use_count() != 1) buf = at::Tensor();
    }
    taken_ = false;
  }
  for (size_t k = 0; k < layers.size(); ++k) {
    at::Tensor& buf = buffers_[k];
    if (buf.defined() && buf.size(0) >= rows) continue;
    const int64_t expected = allocated_ ? expected_later_ : expected_first_;
    const int64_t capacity =
        std::max<int64_t>({rows, 16, buf.defined() ? 2 * buf.size(0) : expected});
    at::Tensor grown = at::empty({capacity, layers[k].size(1)}, layers[k].options());
    if (rows_ > 0) {
      std::memcpy(grown.data_ptr(), buf.data_ptr(), rows_ * buf.size(1) * buf.element_size());
    }
    buf = std::move(grown);
  }
  allocated_ = true;
}

void HiddenBacklog::AppendRange(const std::vector<at::Tensor>& step_layers, int64_t row0,
                                int64_t row_end) {
  if (step_layers.empty() || row_end <= row0) return;
  TORCH_CHECK(store_ == nullptr, "HiddenBacklog: rows appended to slots");
  MaterializeShared();
  const std::vector<at::Tensor> layers = HostRows(step_layers);
  const int64_t n = row_end - row0;
  Reserve(layers, rows_ + n);
  for (size_t k = 0; k < layers.size(); ++k) {
    const size_t row_bytes = layers[k].size(1) * layers[k].element_size();
    std::memcpy(static_cast<char*>(buffers_[k].data_ptr()) + rows_ * row_bytes,
                static_cast<const char*>(layers[k].data_ptr()) + row0 * row_bytes, n * row_bytes);
  }
  rows_ += n;
}

void HiddenBacklog::AppendRows(const std::vector<at::Tensor>& step_layers,
                               const std::vector<int64_t>& rows) {
  if (step_layers.empty() || rows.empty()) return;
  TORCH_CHECK(store_ == nullptr, "HiddenBacklog: rows appended to slots");
  MaterializeShared();
  const std::vector<at::Tensor> layers = HostRows(step_layers);
  const int64_t n = static_cast<int64_t>(rows.size());
  Reserve(layers, rows_ + n);
  for (size_t k = 0; k < layers.size(); ++k) {
    const size_t row_bytes = layers[k].size(1) * layers[k].element_size();
    char* dst = static_cast<char*>(buffers_[k].data_ptr()) + rows_ * row_bytes;
    const char* src = static_cast<const char*>(layers[k].data_ptr());
    for (int64_t r : rows) {
      TORCH_CHECK(r >= 0 && r < layers[k].size(0), "HiddenBacklog: row ", r, " outside the step");
      std::memcpy(dst, src + r * row_bytes, row_bytes);
      dst += row_bytes;
    }
  }
  rows_ += n;
}

void HiddenBacklog::MaterializeShared() {
  if (shared_.empty()) return;
  const std::vector<SharedRow> rows = std::move(shared_);
  shared_.clear();
  const int64_t n = static_cast<int64_t>(rows.size());
  rows_ -= n;  // the buffers' rows
  const std::vector<at::Tensor>& first = *rows.front().layers;
  Reserve(first, rows_ + n);
  for (size_t k = 0; k < first.size(); ++k) {
    const size_t row_bytes = first[k].size(1) * first[k].element_size();
    char* dst = static_cast<char*>(buffers_[k].data_ptr()) + rows_ * row_bytes;
    for (const SharedRow& r : rows) {
      std::memcpy(dst, static_cast<const char*>((*r.layers)[k].data_ptr()) + r.row * row_bytes,
                  row_bytes);
      dst += row_bytes;
    }
  }
  rows_ += n;
}

void HiddenBacklog::AppendShared(SharedLayers layers, const std::vector<int64_t>& rows) {
  if (!layers || layers->empty() || rows.empty()) return;
  TORCH_CHECK(store_ == nullptr, "HiddenBacklog: rows appended to slots");
  TORCH_CHECK(buffers_.empty() || buffers_.size() == layers->size(),
              "HiddenBacklog: shared rows of ", layers->size(), " layers after ", buffers_.size());
  for (const at::Tensor& t : *layers) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 2 && t.is_contiguous(),
                "HiddenBacklog: shared rows are kept from contiguous CPU [rows, hidden] tensors");
  }
  for (int64_t r : rows) {
    TORCH_CHECK(r >= 0 && r < (*layers)[0].size(0), "HiddenBacklog: row ", r, " outside the step");
    shared_.push_back({layers, r});
  }
  rows_ += static_cast<int64_t>(rows.size());
}

void HiddenBacklog::AppendSlots(HiddenRowStore* store, const std::vector<int64_t>& layer_ids,
                                const std::vector<int64_t>& slots) {
  if (slots.empty()) return;
  TORCH_CHECK(rows_ == 0 || store_ == store, "HiddenBacklog: slots appended to other rows");
  store_ = store;
  store_layers_ = layer_ids;
  slots_.insert(slots_.end(), slots.begin(), slots.end());
  rows_ += static_cast<int64_t>(slots.size());
}

std::vector<at::Tensor> HiddenBacklog::Take() {
  MaterializeShared();  // shared rows go out with the buffers' (one copy, as appended rows had)
  std::vector<at::Tensor> out;
  if (store_) {
    try {
      out = store_->Get(store_layers_, slots_);
    } catch (...) {
      Clear();  // the rows are lost either way: free their slots
      throw;
    }
    Clear();
  } else {
    if (rows_ > 0) {
      for (at::Tensor& buf : buffers_) out.push_back(buf.narrow(0, 0, rows_));
    }
    // Kept for the rows to come only if not far larger than they will need (a prompt's).
    for (at::Tensor& buf : buffers_) {
      if (buf.defined() && buf.size(0) > 2 * std::max<int64_t>(expected_later_, 16)) {
        buf = at::Tensor();
      }
    }
    rows_ = 0;
    taken_ = true;
  }
  return out;
}

void HiddenBacklog::KeepNewest(int64_t keep) {
  keep = std::max<int64_t>(keep, 0);
  const int64_t drop = rows_ - keep;
  if (drop <= 0) return;
  if (store_) {
    store_->Free(std::vector<int64_t>(slots_.begin(), slots_.begin() + drop));
    slots_.erase(slots_.begin(), slots_.begin() + drop);
    rows_ = keep;
    return;
  }
  // The buffers' rows come first, then the shared ones. Buffers holding rows were reserved since
  // the last Take (Reserve), so no view of them is out: their kept rows move to the front.
  const int64_t buffered = rows_ - static_cast<int64_t>(shared_.size());
  const int64_t from_buffers = std::min(drop, buffered);
  const int64_t left = buffered - from_buffers;
  if (from_buffers > 0 && left > 0) {
    for (at::Tensor& buf : buffers_) {
      const size_t row_bytes = buf.size(1) * buf.element_size();
      char* data = static_cast<char*>(buf.data_ptr());
      std::memmove(data, data + from_buffers * row_bytes, left * row_bytes);
    }
  }
  const int64_t from_shared = drop - from_buffers;
  if (from_shared > 0) shared_.erase(shared_.begin(), shared_.begin() + from_shared);
  rows_ = keep;
}

void HiddenBacklog::Clear() {
  if (store_) store_->Free(slots_);
  store_ = nullptr;
  store_layers_.clear();
  slots_.clear();
  shared_.clear();
  rows_ = 0;
  buffers_.clear();
  taken_ = false;
  allocated_ = false;
}

}  // namespace specula
