// Which cache positions each new token of a forward attends to, built once per forward and read by
// every layer's paged attention (the target's and every drafter cache's). Torch-free.
//
// A forward adds rows (new tokens) to B sequences. Row r of sequence b sits at cache position
// cached_b + i and sees:
//  - a contiguous span [span_begin, span_end) of its sequence's cache positions (the committed
//    prefix, or for a plain causal chain the prefix and every earlier new token plus itself), and
//  - an explicit list of further positions (token-tree ancestors and itself, or chain tokens under
//    a sliding window), ascending.
// Positions are turned into cache slots through the sequence's block table, so nothing is gathered
// or padded: attention walks each sequence's blocks where they lie.
#pragma once

#include <cstdint>
#include <vector>

namespace specula {

class PagedAttentionLayout {
 public:
  // sliding_window: 0 = none, else a row at RoPE position p sees key positions q with p - q < w.
  PagedAttentionLayout(int64_t block_size, int64_t sliding_window);

  // Appends one sequence's rows. `block_table` must cover cached + num_new positions and outlive
  // the layout's use. `positions` [num_new] are the rows' RoPE positions (empty: cached + i);
  // `parents` [num_new] a token tree over the new rows (-1 = hangs off the prefix; empty = chain).
  // Committed prefix positions are their own RoPE positions (the cache holds committed tokens at
  // position = index). Inputs are assumed validated (ModelRunner::Forward does).
  void AddSequence(const std::vector<int32_t>& block_table, int64_t cached, int64_t num_new,
                   const std::vector<int32_t>& positions = {},
                   const std::vector<int32_t>& parents = {});

  // Appends `num_rows` rows of one sequence that only read: each sees positions [0, visible) of
  // its cache and writes nothing (write slot -1). For queries that are not keys themselves, e.g.
  // a drafter's queries over the target's states (Beagle). Such a layout is for PagedAttentionCpu
  // (`positions` gives the rows' RoPE positions; empty: visible), not for ToPadded.
  void AddReaders(const std::vector<int32_t>& block_table, int64_t visible, int64_t num_rows,
                  const std::vector<int32_t>& positions = {});

  // Appends one sequence's rows as a bidirectional block (SpecDec's query slots, SpecFormer's
  // draft slots over an empty scratch cache): every new row sees the whole committed prefix and
  // every new row, itself included. No sliding window.
  void AddBidirectionalBlock(const std::vector<int32_t>& block_table, int64_t cached,
                             int64_t num_new, const std::vector<int32_t>& positions = {});

  int64_t block_size() const { return block_size_; }
  int64_t num_rows() const { return static_cast<int64_t>(row_seq_.size()); }
  int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }

  // Per row.
  int32_t row_sequence(int64_t r) const { return row_seq_[r]; }
  int32_t span_begin(int64_t r) const { return span_begin_[r]; }
  int32_t span_end(int64_t r) const { return span_end_[r]; }
  const int32_t* extra_begin(int64_t r) const { return extra_.data() + extra_offset_[r]; }
  const int32_t* extra_end(int64_t r) const { return extra_.data() + extra_offset_[r + 1]; }
  // Keys row r attends to in all.
  int64_t visible(int64_t r) const {
    return (span_end_[r] - span_begin_[r]) + (extra_offset_[r + 1] - extra_offset_[r]);
  }
  int64_t total_visible() const { return total_visible_; }
  // The cache slot of position `pos` of the row's sequence.
  int64_t Slot(int64_t r, int64_t pos) const {
    const std::vector<int32_t>& t = *tables_[row_seq_[r]];
    return static_cast<int64_t>(t[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  // Slots the new rows are written to, in row order [num_rows].
  const std::vector<int64_t>& write_slots() const { return write_slots_; }
  // RoPE positions of the rows [num_rows].
  const std::vector<int64_t>& positions() const { return row_pos_; }

  // The padded-grid form (for the LibTorch fallback on devices without the in-place kernel):
  // queries [B, max_q], keys [B, max_k] gathered from read_slots (padding rows repeat a valid slot
  // of the same sequence so that masked values stay finite), mask [B, max_q, max_k].
  struct Padded {
    int64_t max_q = 0, max_k = 0;
    std::vector<int64_t> q_index;     // [N] row of each packed token in the [B * max_q] grid
    std::vector<int64_t> read_slots;  // [B * max_k]
    std::vector<uint8_t> mask;        // [B * max_q * max_k]
  };
  Padded ToPadded() const;

 private:
  int64_t block_size_;
  int64_t window_;
  std::vector<const std::vector<int32_t>*> tables_;
  std::vector<int64_t> seq_cached_, seq_new_, seq_first_row_;
  std::vector<int32_t> row_seq_, span_begin_, span_end_;
  std::vector<int32_t> extra_offset_{0}, extra_;
  std::vector<int64_t> write_slots_, row_pos_;
  int64_t total_visible_ = 0;
};

}  // namespace specula
