#include "common/spec/capacity_scheduler.h"

#include <algorithm>

namespace specula {

CapacityScheduler::CapacityScheduler(CapacityLimits limits) : limits_(limits) {
  limits_.kv_block_size = std::max<int64_t>(limits_.kv_block_size, 1);
}

int64_t CapacityScheduler::BlocksFor(const SpecRequest& request) const {
  return KvBlocksReserved(request, limits_.kv_block_size, limits_.context_length);
}

Status CapacityScheduler::CheckFits(const SpecRequest& request) const {
  const int64_t need = BlocksFor(request);
  if (need > limits_.kv_cache_blocks) {
    return ResourceExhaustedError(StrCat("the request needs ", need,
                                         " KV blocks (prompt + max_new_tokens + draft) but the "
                                         "cache has ",
                                         limits_.kv_cache_blocks));
  }
  return OkStatus();
}

Status CapacityScheduler::Enqueue(RequestId id, const SpecRequest& request) {
  if (IsRunning(id) || IsWaiting(id)) {
    return AlreadyExistsError(
        StrCat("request ", id, " is already ", IsRunning(id) ? "running" : "waiting"));
  }
  RETURN_IF_ERROR(CheckFits(request));
  waiting_.push_back({.id = id, .blocks = BlocksFor(request)});
  return OkStatus();
}

bool CapacityScheduler::Fits(int64_t blocks) const {
  return num_running() < limits_.max_batch_size &&
         reserved_blocks_ + blocks <= limits_.kv_cache_blocks;
}

std::optional<RequestId> CapacityScheduler::NextAdmissible() const {
  if (waiting_.empty() || !Fits(waiting_.front().blocks)) return std::nullopt;
  return waiting_.front().id;
}

Status CapacityScheduler::Admit(RequestId id) {
  if (IsRunning(id)) return AlreadyExistsError(StrCat("request ", id, " is already running"));
  if (!IsWaiting(id)) return NotFoundError(StrCat("request ", id, " is not waiting"));
  const Waiting head = waiting_.front();
  if (head.id != id) {
    return FailedPreconditionError(StrCat("request ", id,
                                          " is not at the head of the queue (request ", head.id,
                                          " is): requests are admitted in order"));
  }
  if (num_running() >= limits_.max_batch_size) {
    return FailedPreconditionError(StrCat("request ", id, " does not fit now: ", num_running(),
                                          " requests run, the batch holds ",
                                          limits_.max_batch_size));
  }
  if (!Fits(head.blocks)) {
    return FailedPreconditionError(StrCat("request ", id, " does not fit now: it needs ",
                                          head.blocks, " KV blocks and ", free_blocks(), " of ",
                                          limits_.kv_cache_blocks, " are free"));
  }
  waiting_.pop_front();
  running_[id] = head.blocks;
  reserved_blocks_ += head.blocks;
  return OkStatus();
}

Status CapacityScheduler::Release(RequestId id) {
  if (auto it = running_.find(id); it != running_.end()) {
    reserved_blocks_ -= it->second;
    running_.erase(it);
    return OkStatus();
  }
  auto it =
      std::find_if(waiting_.begin(), waiting_.end(), [id](const Waiting& w) { return w.id == id; });
  if (it == waiting_.end()) {
    return NotFoundError(StrCat("request ", id, " is neither running nor waiting"));
  }
  waiting_.erase(it);
  return OkStatus();
}

bool CapacityScheduler::IsWaiting(RequestId id) const {
  return std::any_of(waiting_.begin(), waiting_.end(),
                     [id](const Waiting& w) { return w.id == id; });
}

}  // namespace specula
