// ParallelSpec's rows and its group-wise attention mask (paper: "group-wise parallel training"),
// as plain functions shared by training and serving. Torch-free.
//
// Rows over a sequence x_0 .. x_n with target features f_0 .. f_{n-1}:
//   real row r (mask 0):     input fuse(f_r, e(x_{r+1})), RoPE position r, predicts x_{r+2}
//   mask row (r, i), 1..k:   input fuse(0, M_i),          RoPE position r + i, predicts x_{r+2+i}
// Real row r sits at cache index r, so its RoPE position is its cache position (only relative
// distances matter to RoPE; the paper's r + 1 is the same layout shifted by one). Group r is real
// row r and its k masks.
//
// Visibility (who sees whom):
//   - real rows are causal over real rows and never see a mask;
//   - mask (r, i) sees the real rows 0..r and the masks (r, 1..i) of its own group;
//   - no row sees another group's masks.
// So every row's keys are a prefix of the real rows (shared by all groups) plus a prefix of its
// own group's masks: the structured form below, which training runs as shared keys + per-row keys
// (never materialising the (k+1)T x (k+1)T mask) and serving runs as the drafter's cache (real rows
// only) plus the k mask rows appended as one causal chain.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace specula {

struct ParallelSpecRow {
  int64_t group = 0;  // r
  int64_t mask = 0;   // 0 = the real row, i = 1..k = [MASK]_i
};

// The keys a row sees: real rows [0, real_keys) and its own group's masks 1..own_masks.
struct ParallelSpecKeys {
  int64_t real_keys = 0;
  int64_t own_masks = 0;
};

// Row r + i's RoPE position (see above).
inline int64_t ParallelSpecPosition(ParallelSpecRow row) { return row.group + row.mask; }

// The depth (1 = the pending token's child) the row drafts when `row.group` is the last committed
// position: 1 + mask.
inline int64_t ParallelSpecDepth(ParallelSpecRow row) { return 1 + row.mask; }

// real row r: (r + 1, 0); mask (r, i): (r + 1, i).
inline ParallelSpecKeys ParallelSpecVisibleKeys(ParallelSpecRow row) {
  return {.real_keys = row.group + 1, .own_masks = row.mask};
}

// The rows of T groups of k masks in group-major order: (0,0), (0,1) .. (0,k), (1,0), ...
std::vector<ParallelSpecRow> ParallelSpecRows(int64_t T, int64_t k);

// The dense [(k+1)T x (k+1)T] mask of ParallelSpecRows(T, k) (row-major, 1 = visible) built from
// ParallelSpecVisibleKeys: for inspection and tests only (training never builds it).
std::vector<uint8_t> ParallelSpecDenseMask(int64_t T, int64_t k);

}  // namespace specula
