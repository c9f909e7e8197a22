// Capacity scheduling: which waiting requests may join the running batch. One rule for the
// in-process engine (SpecEngine) and the router (services/router's EngineLoop), which plans the
// target's admissions: a request is admitted when the batch has room (max_batch_size) and the
// target's KV cache can hold its worst case (KvBlocksReserved: prompt + max_new_tokens + the
// request's draft cap + 1, at most the context length) on top of every running request's; waiting
// requests are admitted in FIFO order, and a request that does not fit yet holds back the ones
// behind it (no overtaking, so a large request is never starved by small ones). The draft cap in
// the reservation is the request's resolved max_draft_tokens: the router fills requests that set
// none with the server's default (`specula serve --draft-cap` under the adaptive budget), so the
// server-wide cap is reserved for exactly as a request's own is.
//
// Prompt tokens are not budgeted here: the engine prefills admitted prompts in chunks within its
// per-step token budget (SpecEngineOptions::max_step_tokens).
//
// Torch-free (the router uses it without LibTorch). Not thread-safe: one owner (the engine's
// caller, or the router's loop thread) drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>

#include "common/spec/step_contract.h"
#include "common/util/status.h"

namespace specula {

struct CapacityLimits {
  int32_t max_batch_size = 0;   // requests running at once; below 1 admits nothing
  int64_t kv_cache_blocks = 0;  // the target's KV cache
  int64_t kv_block_size = 1;    // tokens per block (values below 1 count as 1)
  int64_t context_length = 0;   // no reservation covers more positions than this
};

class CapacityScheduler {
 public:
  explicit CapacityScheduler(CapacityLimits limits);

  const CapacityLimits& limits() const { return limits_; }

  // KV blocks `request` reserves while it runs (KvBlocksReserved under these limits).
  int64_t BlocksFor(const SpecRequest& request) const;
  // RESOURCE_EXHAUSTED, naming both numbers, when the request needs more blocks than the whole
  // cache has: it could never be admitted.
  Status CheckFits(const SpecRequest& request) const;

  // Queues the request at the tail (its reservation is computed now). RESOURCE_EXHAUSTED as
  // CheckFits (not queued); ALREADY_EXISTS if `id` is waiting or running.
  Status Enqueue(RequestId id, const SpecRequest& request);
  // The head of the queue when it can be admitted now (batch room and KV blocks for its
  // reservation); nothing when the queue is empty or the head has to wait, and then every request
  // behind it waits too (FIFO, no overtaking).
  std::optional<RequestId> NextAdmissible() const;
  // Moves the head of the queue into the batch and reserves its blocks. ALREADY_EXISTS if `id` is
  // running, NOT_FOUND if it is not queued, FAILED_PRECONDITION if it is not NextAdmissible()
  // (behind the head, or the head does not fit now). Nothing changes on error.
  Status Admit(RequestId id);
  // A running request leaves the batch (its blocks and batch slot are free again) or a waiting
  // one leaves the queue. NOT_FOUND if `id` is neither (unknown, or released already).
  Status Release(RequestId id);

  bool IsRunning(RequestId id) const { return running_.count(id) > 0; }
  bool IsWaiting(RequestId id) const;

  // Counters, e.g. for metrics and load reports.
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int64_t reserved_blocks() const { return reserved_blocks_; }  // by running requests
  int64_t free_blocks() const { return limits_.kv_cache_blocks - reserved_blocks_; }

 private:
  struct Waiting {
    RequestId id = 0;
    int64_t blocks = 0;
  };
  bool Fits(int64_t blocks) const;

  CapacityLimits limits_;
  std::deque<Waiting> waiting_;           // FIFO
  std::map<RequestId, int64_t> running_;  // reserved blocks per running request
  int64_t reserved_blocks_ = 0;
};

}  // namespace specula
