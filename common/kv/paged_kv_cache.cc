#include "common/kv/paged_kv_cache.h"

#include <torch/torch.h>

namespace specula {

StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(int64_t num_layers,
                                                             int64_t num_kv_heads, int64_t head_dim,
                                                             at::ScalarType dtype,
                                                             at::Device device,
                                                             const KvCacheOptions& options) {
  if (options.block_size <= 0) return InvalidArgumentError("kv block_size must be positive");
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t bytes_per_block =
      2 * num_layers * options.block_size * num_kv_heads * head_dim * elem;
  int64_t num_blocks = options.num_blocks;
  if (num_blocks <= 0)
    num_blocks = static_cast<int64_t>(options.memory_mb * 1024 * 1024) / bytes_per_block;
  if (num_blocks <= 0) {
    return InvalidArgumentError(StrCat("KV memory budget of ", options.memory_mb,
                                       " MB holds no block (one block takes ", bytes_per_block,
                                       " bytes)"));
  }
  auto cache = std::unique_ptr<PagedKvCache>(new PagedKvCache(num_blocks, options.block_size));
  cache->bytes_per_block_ = bytes_per_block;
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  try {
    for (int64_t l = 0; l < num_layers; ++l) {
      cache->keys_.push_back(
          torch::zeros({num_blocks * options.block_size, num_kv_heads, head_dim}, opts));
      cache->values_.push_back(
          torch::zeros({num_blocks * options.block_size, num_kv_heads, head_dim}, opts));
    }
  } catch (const c10::Error& e) {
    return ResourceExhaustedError(StrCat("cannot allocate KV cache of ", num_blocks,
                                         " blocks: ", e.what_without_backtrace()));
  }
  return cache;
}

Status PagedKvCache::KeepOnly(SeqId seq, int64_t start, const std::vector<int64_t>& offsets) {
  if (!allocator_.HasSequence(seq)) return NotFoundError(StrCat("unknown sequence ", seq));
  const int64_t length = allocator_.Length(seq);
  if (start < 0 || start > length) {
    return OutOfRangeError(
        StrCat("keep-only start ", start, " outside sequence of length ", length));
  }
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] < 0 || start + offsets[i] >= length || (i > 0 && offsets[i] <= offsets[i - 1])) {
      return InvalidArgumentError(
          StrCat("keep-only offsets must be strictly increasing and inside the ", length - start,
                 " uncommitted positions; offset ", i, " is ", offsets[i]));
    }
  }
  std::vector<int64_t> src, dst;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets[i] == static_cast<int64_t>(i)) continue;  // already in place
    src.push_back(allocator_.SlotOf(seq, start + offsets[i]));
    dst.push_back(allocator_.SlotOf(seq, start + static_cast<int64_t>(i)));
  }
  if (!src.empty() && !keys_.empty()) {
    const auto device = keys_[0].device();
    auto src_t = torch::tensor(src, torch::kLong).to(device);
    auto dst_t = torch::tensor(dst, torch::kLong).to(device);
    torch::NoGradGuard no_grad;
    for (size_t l = 0; l < keys_.size(); ++l) {
      // index_select copies first, so overlapping source/destination rows are safe.
      keys_[l].index_copy_(0, dst_t, keys_[l].index_select(0, src_t));
      values_[l].index_copy_(0, dst_t, values_[l].index_select(0, src_t));
    }
  }
  return allocator_.Truncate(seq, start + static_cast<int64_t>(offsets.size()));
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::SequenceKv(int64_t layer, SeqId seq) const {
  const std::vector<int64_t> slots = allocator_.Slots(seq);
  const at::Tensor index =
      at::tensor(slots, at::TensorOptions().dtype(at::kLong)).to(keys_[layer].device());
  return {keys_[layer].index_select(0, index), values_[layer].index_select(0, index)};
}

KvCacheStats PagedKvCache::stats() const {
  return KvCacheStats{allocator_.num_blocks(), allocator_.num_free_blocks(),
                      allocator_.block_size(), allocator_.num_sequences(), bytes_per_block_};
}

}  // namespace specula
