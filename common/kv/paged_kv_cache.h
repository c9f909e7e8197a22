// Paged KV cache storage: per layer one key and one value tensor of [num_blocks * block_size,
// num_kv_heads, head_dim] rows, addressed by the slot ids of a BlockAllocator.
//
// State changes: Append (through allocator()) reserves positions that a forward then fills;
// KeepOnly commits an accepted tree path (compacts the kept entries, drops the rest); Truncate and
// FreeSequence release blocks. Thread-compatible.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/kv/block_allocator.h"
#include "common/util/status.h"

namespace specula {

struct KvCacheOptions {
  int64_t block_size = 16;
  // Either a block count or a memory budget; num_blocks wins when > 0.
  int64_t num_blocks = 0;
  double memory_mb = 256.0;
};

struct KvCacheStats {
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;
  int64_t block_size = 0;
  int64_t num_sequences = 0;
  int64_t bytes_per_block = 0;  // across all layers, keys and values
  // Bytes of the blocks in use.
  int64_t bytes_in_use() const { return (num_blocks - free_blocks) * bytes_per_block; }
  double usage() const { return num_blocks ? 1.0 - double(free_blocks) / double(num_blocks) : 0.0; }
};

// One sequence's accepted path: keep positions start + offsets[i] (see PagedKvCache::KeepOnly).
struct PathCommit {
  SeqId seq = 0;
  int64_t start = 0;
  std::vector<int64_t> offsets;
};

class PagedKvCache {
 public:
  // INVALID_ARGUMENT if the budget holds no block. `dtype`/`device` are the model's.
  static StatusOr<std::unique_ptr<PagedKvCache>> Create(int64_t num_layers, int64_t num_kv_heads,
                                                        int64_t head_dim, at::ScalarType dtype,
                                                        at::Device device,
                                                        const KvCacheOptions& options);

  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  at::Tensor& keys(int64_t layer) { return keys_[layer]; }      // [num_slots, n_kv, head_dim]
  at::Tensor& values(int64_t layer) { return values_[layer]; }  // [num_slots, n_kv, head_dim]
  const at::Tensor& keys(int64_t layer) const { return keys_[layer]; }
  const at::Tensor& values(int64_t layer) const { return values_[layer]; }

  // Keeps only positions start + offsets[i] (offsets strictly increasing, all inside the sequence),
  // moving them to start + i, and truncates the sequence to start + offsets.size(). This is how an
  // accepted tree path is committed: the result equals a cache built by decoding the path alone.
  Status KeepOnly(SeqId seq, int64_t start, const std::vector<int64_t>& offsets);
  // KeepOnly for many sequences in one copy over every layer's keys and values (a step commits
  // the whole batch with two tensor ops). All commits are validated before anything moves: an
  // error changes nothing. A sequence may appear once.
  Status KeepOnlyAll(const std::vector<PathCommit>& commits);

  // All layers' keys and values in one tensor [2, num_layers, num_slots, n_kv, head_dim]; keys(l)
  // and values(l) are views of it.
  const at::Tensor& storage() const { return storage_; }

  // Copies of the keys and values [Length(seq), n_kv, head_dim] of `layer` for every position of a
  // sequence the allocator holds (inspection and tests; the hot paths gather slots themselves).
  std::pair<at::Tensor, at::Tensor> SequenceKv(int64_t layer, SeqId seq) const;

  KvCacheStats stats() const;
  // Bytes one block takes across all layers (keys and values).
  int64_t bytes_per_block() const { return bytes_per_block_; }

 private:
  PagedKvCache(int64_t num_blocks, int64_t block_size) : allocator_(num_blocks, block_size) {}
  BlockAllocator allocator_;
  at::Tensor storage_;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
  int64_t bytes_per_block_ = 0;
};

}  // namespace specula
