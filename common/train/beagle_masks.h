// Beagle's training attention masks (paper Sec. 4.2) as plain functions. Torch-free.
//
// Windows of size k at offset eps in [0, k) start at n_w = eps + w * k (w any integer). Position p
// belongs to the window with n_w < p <= n_w + k; its window position is i = p - n_w (1..k) and
// its last visible true key is n_w. A query at p predicts token p + 1 from its own token t_p and
// the keys it sees. When n_w < 0 it sees no key at all (the trainer leaves it out of every loss).
//
// Early stage ("inverse block attention", T x T over the true states): query p sees the true keys
// j <= n_w; the keys of its own window n_w + 1 .. p - 1 are hidden (and j >= p always is).
//
// Late stage, simulation step i (1..s), T x 2T over [T true states ; T predicted states]: the
// queries at window position i see the true keys j <= n_w and the predicted keys n_w < j < p
// (the drafter's own outputs, written by steps 1 .. i - 1). Rows of other window positions are
// not queried at step i and are all hidden.
//
// Masks are row-major, 1 = visible.
#pragma once

#include <cstdint>
#include <vector>

namespace specula {

struct BeagleWindow {
  int64_t start = 0;  // n_w, the last visible true key (may be negative)
  int64_t index = 0;  // i = p - n_w in 1..k
};

// The window of position p >= 0 (k >= 1, 0 <= eps < k).
BeagleWindow BeagleWindowOf(int64_t p, int64_t k, int64_t eps);

// [T x T]: mask[p * T + j] = (j <= n_w(p)).
std::vector<uint8_t> BeagleEarlyMask(int64_t T, int64_t k, int64_t eps);

// [T x 2T] for simulation step `step` (1..k): row p with window position `step` has the true
// keys j <= n_w (columns 0..T-1) and the predicted keys n_w < j < p (columns T + j); other rows,
// and rows with n_w < 0, are all 0.
std::vector<uint8_t> BeagleLateMask(int64_t T, int64_t k, int64_t eps, int64_t step);

// The positions p < T with window position `step` and n_w >= 0 (the queries of that step), in
// increasing order.
std::vector<int64_t> BeagleStepQueries(int64_t T, int64_t k, int64_t eps, int64_t step);

}  // namespace specula
