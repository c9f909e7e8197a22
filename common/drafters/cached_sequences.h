// The per-sequence table of drafters that keep their own paged cache per sequence (SpecFormer's
// context attention, Beagle's true states): the engine's sequence id -> State, each State holding a
// process-unique id in the cache's block allocator (`kv_seq`) and the tokens observed (`history`,
// the last one pending). Torch-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/kv/block_allocator.h"
#include "common/model/forward_batch.h"
#include "common/sampling/sampler.h"
#include "common/spec/drafter.h"
#include "common/util/status.h"

namespace specula {

// State: constructible from (SeqId kv_seq, const SamplingParams&), with members `SeqId kv_seq`
// and `std::vector<int32_t> history`.
template <typename State>
class CachedSequences {
 public:
  explicit CachedSequences(BlockAllocator* alloc) : alloc_(alloc) {}

  // ALREADY_EXISTS for a known sequence, INVALID_ARGUMENT for bad sampling parameters.
  Status Add(SeqId seq, const SamplingParams& sampling) {
    if (states_.count(seq)) {
      return AlreadyExistsError(StrCat("sequence ", seq, " was already added"));
    }
    RETURN_IF_ERROR(sampling.Validate());
    const SeqId kv_seq = NewSequenceId();
    RETURN_IF_ERROR(alloc_->AddSequence(kv_seq));
    states_.emplace(seq, std::make_unique<State>(kv_seq, sampling));
    return OkStatus();
  }
  // Frees the sequence's cache blocks; unknown sequences are ignored.
  void Release(SeqId seq) {
    auto it = states_.find(seq);
    if (it == states_.end()) return;
    (void)alloc_->FreeSequence(it->second->kv_seq);
    states_.erase(it);
  }

  bool contains(SeqId seq) const { return states_.count(seq) > 0; }
  // nullptr for an unknown sequence.
  State* find(SeqId seq) const {
    auto it = states_.find(seq);
    return it == states_.end() ? nullptr : it->second.get();
  }
  // NOT_FOUND naming the sequence when unknown.
  StatusOr<State*> Get(SeqId seq) const {
    State* st = find(seq);
    if (!st) return NotFoundError(StrCat("sequence ", seq, " was not added"));
    return st;
  }
  // (cache positions, tokens observed) of a known sequence, for CheckHiddenObservations.
  std::optional<std::pair<int64_t, int64_t>> Seen(SeqId seq) const {
    const State* st = find(seq);
    if (!st) return std::nullopt;
    return std::make_pair(alloc_->Length(st->kv_seq), static_cast<int64_t>(st->history.size()));
  }
  // The observations of one Observe call that carry hidden rows, with their reserved positions.
  struct Reserved {
    std::vector<size_t> observations;         // indices into the call's observations
    std::vector<SeqId> kv_seqs;               // their cache ids
    std::vector<int64_t> start;               // first new position
    std::vector<int64_t> rows;                // new rows (m)
    std::vector<std::vector<int64_t>> slots;  // cache slots of the new rows
  };
  // Observe's first half: validates every observation (CheckHiddenObservations against
  // `num_layers` tensors of width `hidden_size`), then reserves cache positions for all new hidden
  // rows at once. On error nothing changed; a full cache is RESOURCE_EXHAUSTED naming `cache`.
  StatusOr<Reserved> Reserve(const std::vector<DrafterObservation>& observations, int64_t vocab,
                             size_t num_layers, int64_t hidden_size, std::string_view cache) {
    ASSIGN_OR_RETURN(std::vector<int64_t> rows,
                     CheckHiddenObservations(observations, vocab, num_layers, hidden_size,
                                             [&](SeqId seq) { return Seen(seq); }));
    Reserved r;
    std::vector<std::pair<SeqId, int64_t>> growth;
    for (size_t i = 0; i < observations.size(); ++i) {
      if (rows[i] == 0) continue;
      const SeqId kv_seq = find(observations[i].seq)->kv_seq;
      r.observations.push_back(i);
      r.kv_seqs.push_back(kv_seq);
      r.start.push_back(alloc_->Length(kv_seq));
      r.rows.push_back(rows[i]);
      growth.emplace_back(kv_seq, rows[i]);
    }
    auto slots = alloc_->AppendAll(growth);
    if (!slots.ok()) return slots.status().WithContext(cache);
    r.slots = std::move(*slots);
    return r;
  }
  // Undoes Reserve when the forward that was to fill the positions failed.
  void Unreserve(const Reserved& r) {
    for (size_t i = 0; i < r.kv_seqs.size(); ++i) (void)alloc_->Truncate(r.kv_seqs[i], r.start[i]);
  }
  // Observe's last step: every observation's tokens join its sequence's history.
  void AppendTokens(const std::vector<DrafterObservation>& observations) {
    for (const DrafterObservation& o : observations) {
      auto& history = find(o.seq)->history;
      history.insert(history.end(), o.tokens.begin(), o.tokens.end());
    }
  }

  std::vector<SeqId> ids() const {
    std::vector<SeqId> seqs;
    for (const auto& [seq, st] : states_) seqs.push_back(seq);
    std::sort(seqs.begin(), seqs.end());
    return seqs;
  }

 private:
  BlockAllocator* alloc_;
  std::unordered_map<SeqId, std::unique_ptr<State>> states_;
};

}  // namespace specula
