#include "common/spec/hidden_row_store.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace specula {

namespace {

at::Tensor Index(const std::vector<int64_t>& values, at::Device device) {
  return at::tensor(values, at::TensorOptions().dtype(at::kLong)).to(device);
}

}  // namespace

std::vector<int64_t> HiddenRowStore::Allocate(int64_t n) {
  std::vector<int64_t> slots;
  slots.reserve(n);
  while (static_cast<int64_t>(slots.size()) < n && !free_.empty()) {
    slots.push_back(free_.back());
    free_.pop_back();
  }
  while (static_cast<int64_t>(slots.size()) < n) slots.push_back(end_++);
  held_ += n;
  return slots;
}

void HiddenRowStore::Grow(int64_t rows) {
  const int64_t capacity = std::max<int64_t>({rows, 64, 2 * capacity_});
  for (auto& [layer, t] : layers_) {
    at::Tensor grown = at::empty({capacity, t.size(1)}, t.options());
    grown.narrow(0, 0, capacity_).copy_(t);
    t = std::move(grown);
  }
  capacity_ = capacity;
}

std::vector<int64_t> HiddenRowStore::Put(const std::vector<int64_t>& layer_ids,
                                         const std::vector<at::Tensor>& layers,
                                         const std::vector<int64_t>& rows) {
  TORCH_CHECK(layer_ids.size() == layers.size(), "HiddenRowStore::Put: ", layer_ids.size(),
              " layer ids for ", layers.size(), " tensors");
  if (rows.empty() || layers.empty()) return {};
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int64_t> slots = Allocate(n);
  try {
    if (end_ > capacity_) Grow(end_);
    for (size_t k = 0; k < layers.size(); ++k) {
      TORCH_CHECK(layers[k].dim() == 2, "HiddenRowStore::Put: layer ", layer_ids[k],
                  " is not [rows, hidden]");
      at::Tensor& store = layers_[layer_ids[k]];
      if (!store.defined()) {
        store = at::empty({capacity_, layers[k].size(1)}, layers[k].options());
      }
      TORCH_CHECK(store.size(1) == layers[k].size(1) &&
                      store.scalar_type() == layers[k].scalar_type() &&
                      store.device() == layers[k].device(),
                  "HiddenRowStore::Put: layer ", layer_ids[k], " changed shape or type");
    }
    // One upload for both index vectors: the step's rows, then the slots they go to.
    std::vector<int64_t> both(rows);
    both.insert(both.end(), slots.begin(), slots.end());
    const at::Tensor index = Index(both, layers[0].device());
    const at::Tensor from = index.narrow(0, 0, n), to = index.narrow(0, n, n);
    for (size_t k = 0; k < layers.size(); ++k) {
      layers_[layer_ids[k]].index_copy_(0, to, layers[k].index_select(0, from));
    }
  } catch (...) {
    Free(slots);
    throw;
  }
  return slots;
}

std::vector<at::Tensor> HiddenRowStore::Get(const std::vector<int64_t>& layer_ids,
                                            const std::vector<int64_t>& slots) const {
  std::vector<at::Tensor> out;
  if (slots.empty()) return out;
  at::Tensor index;
  for (int64_t layer : layer_ids) {
    const auto it = layers_.find(layer);
    TORCH_CHECK(it != layers_.end(), "HiddenRowStore::Get: no rows of layer ", layer);
    if (!index.defined()) index = Index(slots, it->second.device());
    out.push_back(it->second.index_select(0, index));
  }
  return out;
}

void HiddenRowStore::Free(const std::vector<int64_t>& slots) {
  free_.insert(free_.end(), slots.begin(), slots.end());
  held_ -= static_cast<int64_t>(slots.size());
  if (held_ == 0) {  // nothing in use: give the memory back (the next step starts small)
    layers_.clear();
    free_.clear();
    capacity_ = end_ = 0;
  }
}

}  // namespace specula
