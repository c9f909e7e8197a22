#include "common/model/paged_attention_layout.h"

#include <algorithm>

namespace specula {

PagedAttentionLayout::PagedAttentionLayout(int64_t block_size, int64_t sliding_window)
    : block_size_(block_size), window_(sliding_window) {}

void PagedAttentionLayout::AddSequence(const std::vector<int32_t>& block_table, int64_t cached,
                                       int64_t num_new, const std::vector<int32_t>& positions,
                                       const std::vector<int32_t>& parents) {
  const int32_t b = static_cast<int32_t>(tables_.size());
  tables_.push_back(&block_table);
  seq_cached_.push_back(cached);
  seq_new_.push_back(num_new);
  seq_first_row_.push_back(num_rows());
  auto pos_of = [&](int64_t i) -> int64_t { return positions.empty() ? cached + i : positions[i]; };
  // A plain continuation without a window sees one contiguous span; anything else lists the new
  // tokens it sees explicitly.
  const bool plain = parents.empty() && window_ == 0;
  std::vector<int32_t> ancestors;
  for (int64_t i = 0; i < num_new; ++i) {
    const int64_t p = pos_of(i);
    const int64_t cache_pos = cached + i;
    row_seq_.push_back(b);
    row_pos_.push_back(p);
    write_slots_.push_back(static_cast<int64_t>(block_table[cache_pos / block_size_]) *
                               block_size_ +
                           cache_pos % block_size_);
    if (plain) {
      span_begin_.push_back(0);
      span_end_.push_back(static_cast<int32_t>(cache_pos + 1));
    } else {
      // Prefix position j is visible iff p - j < window.
      const int64_t lo = window_ > 0 ? std::clamp<int64_t>(p - window_ + 1, 0, cached) : 0;
      span_begin_.push_back(static_cast<int32_t>(lo));
      span_end_.push_back(static_cast<int32_t>(cached));
      ancestors.clear();
      if (parents.empty()) {
        for (int64_t a = 0; a <= i; ++a) ancestors.push_back(static_cast<int32_t>(a));
      } else {
        for (int64_t a = i; a >= 0; a = parents[a]) ancestors.push_back(static_cast<int32_t>(a));
        std::reverse(ancestors.begin(), ancestors.end());
      }
      for (int32_t a : ancestors) {
        if (window_ == 0 || p - pos_of(a) < window_) {
          extra_.push_back(static_cast<int32_t>(cached + a));
        }
      }
    }
    extra_offset_.push_back(static_cast<int32_t>(extra_.size()));
    total_visible_ += visible(num_rows() - 1);
  }
}

void PagedAttentionLayout::AddReaders(const std::vector<int32_t>& block_table, int64_t visible,
                                      int64_t num_rows, const std::vector<int32_t>& positions) {
  const int32_t b = static_cast<int32_t>(tables_.size());
  tables_.push_back(&block_table);
  seq_cached_.push_back(visible);
  seq_new_.push_back(0);
  seq_first_row_.push_back(this->num_rows());
  for (int64_t i = 0; i < num_rows; ++i) {
    row_seq_.push_back(b);
    row_pos_.push_back(positions.empty() ? visible : positions[i]);
    write_slots_.push_back(-1);
    span_begin_.push_back(0);
    span_end_.push_back(static_cast<int32_t>(visible));
    extra_offset_.push_back(static_cast<int32_t>(extra_.size()));
    total_visible_ += visible;
  }
}

void PagedAttentionLayout::AddBidirectionalBlock(const std::vector<int32_t>& block_table,
                                                 int64_t cached, int64_t num_new,
                                                 const std::vector<int32_t>& positions) {
  const int32_t b = static_cast<int32_t>(tables_.size());
  tables_.push_back(&block_table);
  seq_cached_.push_back(cached);
  seq_new_.push_back(num_new);
  seq_first_row_.push_back(num_rows());
  for (int64_t i = 0; i < num_new; ++i) {
    const int64_t cache_pos = cached + i;
    row_seq_.push_back(b);
    row_pos_.push_back(positions.empty() ? cache_pos : positions[i]);
    write_slots_.push_back(static_cast<int64_t>(block_table[cache_pos / block_size_]) *
                               block_size_ +
                           cache_pos % block_size_);
    span_begin_.push_back(0);
    span_end_.push_back(static_cast<int32_t>(cached + num_new));
    extra_offset_.push_back(static_cast<int32_t>(extra_.size()));
    total_visible_ += visible(num_rows() - 1);
  }
}

PagedAttentionLayout::Padded PagedAttentionLayout::ToPadded() const {
  Padded p;
  const int64_t B = num_sequences(), N = num_rows();
  for (int64_t b = 0; b < B; ++b) {
    p.max_q = std::max(p.max_q, seq_new_[b]);
    p.max_k = std::max(p.max_k, seq_cached_[b] + seq_new_[b]);
  }
  p.q_index.resize(N);
  p.read_slots.assign(B * p.max_k, 0);
  p.mask.assign(static_cast<size_t>(B * p.max_q * p.max_k), 0);
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& t = *tables_[b];
    const int64_t len = seq_cached_[b] + seq_new_[b];
    for (int64_t k = 0; k < p.max_k; ++k) {
      const int64_t pos = k < len ? k : 0;  // padding keys repeat position 0: finite, masked out
      p.read_slots[b * p.max_k + k] =
          static_cast<int64_t>(t[pos / block_size_]) * block_size_ + pos % block_size_;
    }
    for (int64_t i = seq_new_[b]; i < p.max_q; ++i) {
      p.mask[static_cast<size_t>((b * p.max_q + i) * p.max_k)] = 1;  // padding query row
    }
  }
  for (int64_t r = 0; r < N; ++r) {
    const int64_t b = row_seq_[r];
    const int64_t i = r - seq_first_row_[b];
    p.q_index[r] = b * p.max_q + i;
    uint8_t* mrow = &p.mask[static_cast<size_t>((b * p.max_q + i) * p.max_k)];
    for (int64_t j = span_begin_[r]; j < span_end_[r]; ++j) mrow[j] = 1;
    for (const int32_t* e = extra_begin(r); e != extra_end(r); ++e) mrow[*e] = 1;
  }
  return p;
}

}  // namespace specula
