// How big a drafter's own paged cache is (SpecFormer's context cache, Beagle's true states).
// Sized from the target's KV cache by default: the same number of blocks of the same size, so any
// set of sequences the target admits fits the drafter too (a drafter caches at most the
// positions the target does) and the drafter needs no admission rule of its own. Its memory is
// the target's KV memory scaled by (drafter layers x kv width) / (target layers x kv width): one
// layer against the target's L, so 1/L of it for equal widths.
#pragma once

#include "common/kv/paged_kv_cache.h"

namespace specula {

// `kv` as given when it names a size (num_blocks or memory_mb > 0); else the target's blocks and
// block size.
inline KvCacheOptions SizedFromTarget(KvCacheOptions kv, const KvCacheStats& target) {
  if (kv.num_blocks > 0 || kv.memory_mb > 0) return kv;
  kv.block_size = target.block_size;
  kv.num_blocks = target.num_blocks;
  return kv;
}

}  // namespace specula
