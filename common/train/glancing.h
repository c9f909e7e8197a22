// Glancing training (Qian et al.'s GLAT, as SpecDec trains its drafter): after a first pass
// without gradient, some of the slots the drafter got wrong show their gold token as input in the
// second pass, and the loss is taken on the other slots. Torch-free.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace specula {

// One draft's k slots: predicted[j] (the first pass's argmax) and gold[j] (-1 = no label, never
// revealed). Reveals round(ratio * wrong) of the wrong slots (predicted != gold, gold >= 0),
// chosen uniformly by `rng`. Returns [k]: the gold token for a revealed slot, -1 for a masked one.
// ratio is clamped to [0, 1]; 0 reveals nothing (glancing off).
std::vector<int64_t> GlancingReveal(const std::vector<int64_t>& predicted,
                                    const std::vector<int64_t>& gold, double ratio,
                                    std::mt19937_64& rng);

// The glancing ratio at `step` of `total`: `start` annealed linearly to 0 at the last step.
double GlancingRatio(double start, int64_t step, int64_t total);

}  // namespace specula
