#include "common/kv/block_allocator.h"

namespace specula {

BlockAllocator::BlockAllocator(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  free_.reserve(num_blocks);
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

const BlockAllocator::Table* BlockAllocator::Find(SeqId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? nullptr : &it->second;
}

Status BlockAllocator::AddSequence(SeqId seq) {
  if (!tables_.emplace(seq, Table{}).second) {
    return Status(StatusCode::kAlreadyExists, StrCat("sequence ", seq, " already exists"));
  }
  return OkStatus();
}

Status BlockAllocator::FreeSequence(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return NotFoundError(StrCat("unknown sequence ", seq));
  for (auto it2 = it->second.blocks.rbegin(); it2 != it->second.blocks.rend(); ++it2)
    free_.push_back(*it2);
  tables_.erase(it);
  return OkStatus();
}

int64_t BlockAllocator::BlocksNeeded(SeqId seq, int64_t n) const {
  const Table* t = Find(seq);
  const int64_t length = t ? t->length : 0;
  const int64_t have = t ? static_cast<int64_t>(t->blocks.size()) : 0;
  const int64_t need = (length + n + block_size_ - 1) / block_size_;
  return need > have ? need - have : 0;
}

const std::vector<int32_t>& BlockAllocator::BlockTable(SeqId seq) const {
  static const std::vector<int32_t> kEmpty;
  const Table* t = Find(seq);
  return t ? t->blocks : kEmpty;
}

StatusOr<std::vector<int64_t>> BlockAllocator::Append(SeqId seq, int64_t n) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return NotFoundError(StrCat("unknown sequence ", seq));
  if (n < 0) return InvalidArgumentError("cannot append a negative number of positions");
  const int64_t extra = BlocksNeeded(seq, n);
  if (extra > num_free_blocks()) {
    return ResourceExhaustedError(StrCat("KV cache full: sequence ", seq, " needs ", extra,
                                         " more blocks of ", block_size_, " positions, ",
                                         num_free_blocks(), " of ", num_blocks_, " are free"));
  }
  Table& t = it->second;
  for (int64_t i = 0; i < extra; ++i) {
    t.blocks.push_back(free_.back());
    free_.pop_back();
  }
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = t.length + i;
    slots[i] = static_cast<int64_t>(t.blocks[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  t.length += n;
  return slots;
}

StatusOr<std::vector<std::vector<int64_t>>> BlockAllocator::AppendAll(
    const std::vector<std::pair<SeqId, int64_t>>& growth) {
  int64_t extra = 0;
  for (size_t i = 0; i < growth.size(); ++i) {
    const auto [seq, n] = growth[i];
    if (!HasSequence(seq)) return NotFoundError(StrCat("unknown sequence ", seq));
    if (n < 0) return InvalidArgumentError("cannot append a negative number of positions");
    for (size_t j = 0; j < i; ++j) {
      if (growth[j].first == seq) {
        return InvalidArgumentError(StrCat("sequence ", seq, " is listed twice"));
      }
    }
    extra += BlocksNeeded(seq, n);
  }
  if (extra > num_free_blocks()) {
    return ResourceExhaustedError(StrCat("KV cache full: ", growth.size(), " sequences need ",
                                         extra, " more blocks of ", block_size_, " positions, ",
                                         num_free_blocks(), " of ", num_blocks_, " are free"));
  }
  std::vector<std::vector<int64_t>> slots;
  for (const auto& [seq, n] : growth) {
    auto appended = Append(seq, n);  // fits: checked above
    if (!appended.ok()) return appended.status();
    slots.push_back(std::move(*appended));
  }
  return slots;
}

Status BlockAllocator::Truncate(SeqId seq, int64_t new_length) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return NotFoundError(StrCat("unknown sequence ", seq));
  Table& t = it->second;
  if (new_length < 0 || new_length > t.length) {
    return OutOfRangeError(
        StrCat("cannot truncate sequence ", seq, " of length ", t.length, " to ", new_length));
  }
  t.length = new_length;
  const size_t keep = static_cast<size_t>((new_length + block_size_ - 1) / block_size_);
  while (t.blocks.size() > keep) {
    free_.push_back(t.blocks.back());
    t.blocks.pop_back();
  }
  return OkStatus();
}

int64_t BlockAllocator::Length(SeqId seq) const {
  const Table* t = Find(seq);
  return t ? t->length : 0;
}

int64_t BlockAllocator::SlotOf(SeqId seq, int64_t position) const {
  const Table& t = *Find(seq);
  return static_cast<int64_t>(t.blocks[position / block_size_]) * block_size_ +
         position % block_size_;
}

std::vector<int64_t> BlockAllocator::Slots(SeqId seq) const {
  const Table* t = Find(seq);
  std::vector<int64_t> slots;
  if (t == nullptr) return slots;
  slots.resize(t->length);
  for (int64_t p = 0; p < t->length; ++p) {
    slots[p] = static_cast<int64_t>(t->blocks[p / block_size_]) * block_size_ + p % block_size_;
  }
  return slots;
}

}  // namespace specula
