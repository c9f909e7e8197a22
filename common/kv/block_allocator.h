// Paged KV bookkeeping: fixed-size blocks, a free list, and one block table per sequence.
// Torch-free; PagedKvCache owns the tensors these slot ids index.
//
// A slot id is block * block_size + offset: the row of the flat [num_blocks * block_size, ...] KV
// tensor that holds one position of one sequence. Positions of a sequence are contiguous from 0 to
// length-1. Thread-compatible (callers serialise access).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/util/status.h"

namespace specula {

using SeqId = int64_t;

class BlockAllocator {
 public:
  BlockAllocator(int64_t num_blocks, int64_t block_size);

  // ALREADY_EXISTS if the id is taken.
  Status AddSequence(SeqId seq);
  bool HasSequence(SeqId seq) const { return tables_.count(seq) > 0; }
  // NOT_FOUND if unknown. Returns every block of the sequence to the free list.
  Status FreeSequence(SeqId seq);

  // Grows the sequence by n positions and returns their slot ids [n]. All or nothing: on
  // RESOURCE_EXHAUSTED (not enough free blocks) the sequence is unchanged.
  StatusOr<std::vector<int64_t>> Append(SeqId seq, int64_t n);
  // Append for several distinct sequences at once, all or nothing: on NOT_FOUND, INVALID_ARGUMENT
  // (a sequence listed twice, a negative count) or RESOURCE_EXHAUSTED (the blocks all of them need
  // are not free) no sequence changed. Returns each entry's new slots, in order.
  StatusOr<std::vector<std::vector<int64_t>>> AppendAll(
      const std::vector<std::pair<SeqId, int64_t>>& growth);
  // Shrinks to new_length positions, releasing blocks no longer used.
  Status Truncate(SeqId seq, int64_t new_length);

  int64_t Length(SeqId seq) const;  // 0 for unknown sequences
  // Precondition: the sequence exists and 0 <= position < Length(seq).
  int64_t SlotOf(SeqId seq, int64_t position) const;
  std::vector<int64_t> Slots(SeqId seq) const;  // slot of each position [Length(seq)]
  // The sequence's block ids in position order (empty for unknown sequences): what paged attention
  // walks instead of a per-position slot list.
  const std::vector<int32_t>& BlockTable(SeqId seq) const;
  // Blocks needed to grow `seq` by n positions (0 if it fits in its last block).
  int64_t BlocksNeeded(SeqId seq, int64_t n) const;

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }

 private:
  struct Table {
    std::vector<int32_t> blocks;
    int64_t length = 0;
  };
  const Table* Find(SeqId seq) const;

  int64_t num_blocks_;
  int64_t block_size_;
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first (warm in cache)
  std::unordered_map<SeqId, Table> tables_;
};

}  // namespace specula
