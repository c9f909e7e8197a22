#include "common/kv/paged_kv_cache.h"

#include <torch/torch.h>

#include <cstring>

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
    // Uninitialised on CPU: the OS maps pages only when a block is first written, so resident
    // memory follows the KV actually used, not the budget. Attention never reads a slot before it
    // is written. Zeroed elsewhere (device memory is not lazily mapped anyway).
    const std::vector<int64_t> shape = {2, num_layers, num_blocks * options.block_size,
                                        num_kv_heads, head_dim};
    cache->storage_ = device.is_cpu() ? torch::empty(shape, opts) : torch::zeros(shape, opts);
    for (int64_t l = 0; l < num_layers; ++l) {
      cache->keys_.push_back(cache->storage_[0][l]);
      cache->values_.push_back(cache->storage_[1][l]);
    }
  } catch (const std::exception& e) {
    return ResourceExhaustedError(
        StrCat("cannot allocate KV cache of ", num_blocks, " blocks: ", e.what()));
  }
  return cache;
}

Status PagedKvCache::KeepOnly(SeqId seq, int64_t start, const std::vector<int64_t>& offsets) {
  return KeepOnlyAll({{.seq = seq, .start = start, .offsets = offsets}});
}

Status PagedKvCache::KeepOnlyAll(const std::vector<PathCommit>& commits) {
  for (size_t c = 0; c < commits.size(); ++c) {
    const PathCommit& commit = commits[c];
    const SeqId seq = commit.seq;
    if (!allocator_.HasSequence(seq)) return NotFoundError(StrCat("unknown sequence ", seq));
    for (size_t p = 0; p < c; ++p) {
      if (commits[p].seq == seq) {
        return InvalidArgumentError(StrCat("sequence ", seq, " is committed twice"));
      }
    }
    const int64_t length = allocator_.Length(seq);
    const int64_t start = commit.start;
    if (start < 0 || start > length) {
      return OutOfRangeError(
          StrCat("keep-only start ", start, " outside sequence of length ", length));
    }
    const std::vector<int64_t>& offsets = commit.offsets;
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (offsets[i] < 0 || start + offsets[i] >= length ||
          (i > 0 && offsets[i] <= offsets[i - 1])) {
        return InvalidArgumentError(
            StrCat("keep-only offsets must be strictly increasing and inside the ", length - start,
                   " uncommitted positions; offset ", i, " is ", offsets[i]));
      }
    }
  }
  // Kept positions only move down (offsets[i] >= i) inside their own sequence, and index_select
  // copies before index_copy_ writes, so overlapping rows are safe.
  std::vector<int64_t> src, dst;
  for (const PathCommit& commit : commits) {
    for (size_t i = 0; i < commit.offsets.size(); ++i) {
      if (commit.offsets[i] == static_cast<int64_t>(i)) continue;  // already in place
      src.push_back(allocator_.SlotOf(commit.seq, commit.start + commit.offsets[i]));
      dst.push_back(allocator_.SlotOf(commit.seq, commit.start + static_cast<int64_t>(i)));
    }
  }
  if (!src.empty() && storage_.defined() && storage_.device().is_cpu()) {
    // Row by row: each kept position moves down within its own sequence, so a row is read
    // before anything lands on it (a later move's source lies past every earlier destination).
    // LibTorch's index_select + index_copy_ cost ~90 us a drafted step on the CPU (dispatch and
    // a thread-pool wake-up for a few rows), 0.4% of a batch-4 run that drafted 4% of its steps.
    const int64_t planes = storage_.size(0) * storage_.size(1), slots = storage_.size(2);
    const size_t row_bytes = storage_.size(3) * storage_.size(4) * storage_.element_size();
    char* base = static_cast<char*>(storage_.data_ptr());
    for (size_t i = 0; i < src.size(); ++i) {
      for (int64_t p = 0; p < planes; ++p) {
        char* plane = base + static_cast<size_t>(p * slots) * row_bytes;
        std::memcpy(plane + dst[i] * row_bytes, plane + src[i] * row_bytes, row_bytes);
      }
    }
  } else if (!src.empty() && storage_.defined()) {
    c10::InferenceMode inference;
    const auto device = storage_.device();
    auto src_t = torch::tensor(src, torch::kLong).to(device);
    auto dst_t = torch::tensor(dst, torch::kLong).to(device);
    storage_.index_copy_(2, dst_t, storage_.index_select(2, src_t));
  }
  for (const PathCommit& commit : commits) {
    RETURN_IF_ERROR(allocator_.Truncate(
        commit.seq, commit.start + static_cast<int64_t>(commit.offsets.size())));
  }
  return OkStatus();
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
