#include "common/drafters/parallelspec/parallelspec_layout.h"

namespace specula {

std::vector<ParallelSpecRow> ParallelSpecRows(int64_t T, int64_t k) {
  std::vector<ParallelSpecRow> rows;
  rows.reserve(static_cast<size_t>(T * (k + 1)));
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t i = 0; i <= k; ++i) rows.push_back({.group = r, .mask = i});
  }
  return rows;
}

std::vector<uint8_t> ParallelSpecDenseMask(int64_t T, int64_t k) {
  const std::vector<ParallelSpecRow> rows = ParallelSpecRows(T, k);
  const size_t n = rows.size();
  std::vector<uint8_t> mask(n * n, 0);
  for (size_t q = 0; q < n; ++q) {
    const ParallelSpecKeys keys = ParallelSpecVisibleKeys(rows[q]);
    for (size_t j = 0; j < n; ++j) {
      const ParallelSpecRow key = rows[j];
      const bool visible = key.mask == 0 ? key.group < keys.real_keys
                                         : key.group == rows[q].group && key.mask <= keys.own_masks;
      mask[q * n + j] = visible ? 1 : 0;
    }
  }
  return mask;
}

}  // namespace specula
