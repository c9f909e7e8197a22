// The interface every drafter implements (n-gram lookup, the standalone draft LM, SpecFormer,
// Beagle, ...). A drafter keeps per-sequence state and is driven in batches by SpecEngine:
//
//   AddSequence(seq, sampling)             once, before the sequence's first Observe
//   Observe({seq, tokens, hidden})         after every target step: the tokens appended to the
//                                          sequence and the target's hidden states of the positions
//                                          that entered the target's KV cache
//   Propose({seq, max_nodes, ...})         a CandidateTree hanging off the sequence's last token
//   ReleaseSequence(seq)
//
// Invariant the engine keeps: the target's KV cache holds every token of the sequence except the
// last one (the pending token). After prefill, Observe gets tokens = prompt + first generated token
// and hidden states for the prompt's positions; after a verification step, tokens = the accepted
// draft tokens + the bonus token, hidden states for the old pending token + the accepted tokens.
// So hidden row i always belongs to the token at sequence position (positions_before + i).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/model/forward_batch.h"
#include "common/sampling/sampler.h"
#include "common/spec/candidate_tree.h"
#include "common/util/status.h"

namespace specula {

struct DrafterObservation {
  SeqId seq = 0;
  std::vector<int32_t> tokens;  // appended to the sequence, in order
  // One tensor per layer of Drafter::hidden_layers(), each [m, hidden] in the target's dtype and
  // device: the target's hidden states of the m positions that entered its KV cache.
  std::vector<at::Tensor> hidden;
};

struct DraftRequest {
  SeqId seq = 0;
  int32_t max_nodes = 0;  // tree size budget (the step plan's per-sequence draft budget)
  int32_t max_depth = 0;  // no node deeper than this (context and max_new_tokens limits)
  // Drafters that sample candidates cut each proposal distribution to its top proposal_top_k
  // tokens before sampling and attach that sparse distribution (TopKProposal,
  // common/spec/proposal.h), which keeps verification lossless. 0 = dense. In-process drafters get
  // 0 (nothing to send); the drafter service sets its --proposal-top-k for the trees it sends.
  int32_t proposal_top_k = 0;
  // The reach a node must have to be worth verifying (P(it and its ancestors accepted), the
  // budget policy's price of a forward row in tokens: DraftBudgetPolicy, BudgetDecision). A
  // drafter that can estimate reach may leave out the nodes below it; 0 = keep every node.
  double min_reach = 0;
  // The same for a drafter that runs one forward per depth (the draft LM): it runs the next
  // depth only if the expected reach of the nodes that depth adds, summed over the call's
  // requests, is at least this (the budget policy's price of the drafter's depth in tokens;
  // requests of one call share it). 0 = every depth within the budget.
  double depth_reach = 0;
};

// The checks every Propose starts with: each request names a sequence the drafter holds
// (`holds(seq)`), at most once. NOT_FOUND / INVALID_ARGUMENT naming the sequence.
template <typename Holds>
Status CheckDraftRequests(const std::vector<DraftRequest>& requests, const Holds& holds) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const SeqId seq = requests[i].seq;
    if (!holds(seq)) return NotFoundError(StrCat("sequence ", seq, " was not added"));
    for (size_t j = 0; j < i; ++j) {
      if (requests[j].seq == seq) {
        return InvalidArgumentError(StrCat("sequence ", seq, " is requested twice"));
      }
    }
  }
  return OkStatus();
}

// The checks every Observe of a token-only drafter starts with, before it changes anything: each
// observation names a sequence the drafter holds (`holds(seq)`), at most once, with tokens inside
// [0, vocab) (vocab <= 0: unchecked). NOT_FOUND / INVALID_ARGUMENT naming the sequence and field.
template <typename Holds>
Status CheckTokenObservations(const std::vector<DrafterObservation>& observations, int64_t vocab,
                              const Holds& holds) {
  for (size_t i = 0; i < observations.size(); ++i) {
    const DrafterObservation& o = observations[i];
    if (!holds(o.seq)) return NotFoundError(StrCat("sequence ", o.seq, " was not added"));
    for (size_t j = 0; j < i; ++j) {
      if (observations[j].seq == o.seq) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, " is observed twice in one call"));
      }
    }
    for (size_t t = 0; vocab > 0 && t < o.tokens.size(); ++t) {
      if (o.tokens[t] < 0 || o.tokens[t] >= vocab) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, ": tokens[", t, "] = ", o.tokens[t],
                                           " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
  }
  return OkStatus();
}

// The checks every Observe of a drafter that reads hidden states (SpecFormer, Beagle) starts with,
// before it changes anything: each observation names a sequence the drafter holds, at most once;
// tokens inside [0, vocab); hidden states either absent or exactly `num_layers` tensors of shape
// [m, hidden_size] (one m for all); and the invariant "one hidden row per token but the pending
// one" (rows seen + m == tokens seen + new tokens - 1). `seen(seq)` returns
// std::optional<std::pair<rows seen, tokens seen>> (nullopt = unknown sequence). Returns each
// observation's m. With `num_layers` 0 (a drafter whose rows come from tokens alone, e.g.
// ParallelSpec without target features) no hidden state may be given and m is what keeps the
// invariant. NOT_FOUND / INVALID_ARGUMENT naming the sequence and the field.
template <typename Seen>
StatusOr<std::vector<int64_t>> CheckHiddenObservations(
    const std::vector<DrafterObservation>& observations, int64_t vocab, size_t num_layers,
    int64_t hidden_size, const Seen& seen) {
  std::vector<int64_t> rows(observations.size(), 0);
  for (size_t i = 0; i < observations.size(); ++i) {
    const DrafterObservation& o = observations[i];
    const auto state = seen(o.seq);
    if (!state) return NotFoundError(StrCat("sequence ", o.seq, " was not added"));
    for (size_t j = 0; j < i; ++j) {
      if (observations[j].seq == o.seq) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, " is observed twice in one call"));
      }
    }
    for (size_t t = 0; t < o.tokens.size(); ++t) {
      if (o.tokens[t] < 0 || o.tokens[t] >= vocab) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, ": tokens[", t, "] = ", o.tokens[t],
                                           " is outside the vocabulary [0, ", vocab, ")"));
      }
    }
    const auto [rows_seen, tokens_seen] = *state;
    const int64_t tokens = tokens_seen + static_cast<int64_t>(o.tokens.size());
    int64_t m = 0;
    if (num_layers == 0) {
      if (!o.hidden.empty()) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, ": ", o.hidden.size(),
                                           " hidden-state tensors, the drafter reads none"));
      }
      m = std::max<int64_t>(0, tokens - 1 - rows_seen);
    } else if (!o.hidden.empty()) {
      if (o.hidden.size() != num_layers) {
        return InvalidArgumentError(StrCat("sequence ", o.seq, ": ", o.hidden.size(),
                                           " hidden-state tensors, the drafter reads ", num_layers,
                                           " layers"));
      }
      m = o.hidden[0].dim() == 2 ? o.hidden[0].size(0) : -1;
      for (size_t k = 0; k < num_layers; ++k) {
        const at::Tensor& h = o.hidden[k];
        if (h.dim() != 2 || h.size(0) != m || h.size(1) != hidden_size) {
          return InvalidArgumentError(StrCat("sequence ", o.seq, ": hidden[", k, "] has shape ",
                                             h.sizes(), ", expected [", m < 0 ? 0 : m, ", ",
                                             hidden_size, "]"));
        }
      }
    }
    // Every token but the pending one has had its hidden state observed.
    if (rows_seen + m != tokens - 1) {
      return InvalidArgumentError(StrCat("sequence ", o.seq, ": ", rows_seen + m,
                                         " hidden-state rows for ", tokens,
                                         " tokens (expected one row per token but the last)"));
    }
    rows[i] = m;
  }
  return rows;
}

// The most per-sequence state a drafter can hold: `blocks` cache blocks of `block_size`
// positions shared by all its sequences (a sequence of n observed positions takes
// ceil(n / block_size)). The engine reserves a sequence's worst case (DrafterBlocksReserved)
// before attaching it, as it reserves the target's KV blocks, so an attached sequence never
// overflows the drafter's cache.
struct DrafterCapacity {
  int64_t blocks = -1;  // < 0: unbounded (drafters whose state is a token history)
  int64_t block_size = 1;
  bool bounded() const { return blocks >= 0; }
};

// The blocks a sequence of at most `positions` tokens can take in a drafter's cache: every token
// but the pending one has a cached position.
inline int64_t DrafterBlocksReserved(int64_t positions, const DrafterCapacity& capacity) {
  if (!capacity.bounded() || positions <= 1) return 0;
  const int64_t size = capacity.block_size > 0 ? capacity.block_size : 1;
  return (positions - 1 + size - 1) / size;
}

class Drafter {
 public:
  virtual ~Drafter() = default;

  virtual std::string name() const = 0;
  // Target layers (0 = embeddings, i = output of layer i, L = after the final norm) whose hidden
  // states Observe must carry, fixed for the drafter's life. Empty for drafters that need only
  // tokens. A reference: the engine asks several times per sequence per step.
  virtual const std::vector<int64_t>& hidden_layers() const {
    static const std::vector<int64_t> kNone;
    return kNone;
  }

  // `sampling` is the request's: drafters that sample their candidates shape their proposal
  // distribution the same way the target's is shaped, and seed their own random stream from it.
  // Greedy requests get deterministic drafts.
  virtual Status AddSequence(SeqId seq, const SamplingParams& sampling) = 0;
  virtual void ReleaseSequence(SeqId seq) = 0;
  // A failed Observe changes no sequence's state (all or nothing), except that a remote drafter
  // may have applied a call it answered too late (DEADLINE_EXCEEDED) or not at all (UNAVAILABLE).
  // The engine relies on this to retry each observation of a failed call on its own, so that only
  // the sequences that fail (one overflowing a cache) lose speculation.
  virtual Status Observe(const std::vector<DrafterObservation>& observations) = 0;
  // One tree per request, in order; an empty tree means "nothing to propose", a Failed tree "this
  // sequence could not be drafted" (the others still are). Trees must satisfy
  // CandidateTree::Validate for the request's budget (the engine checks and drops bad ones). A
  // failed call is retried per request, as Observe is.
  virtual StatusOr<std::vector<CandidateTree>> Propose(
      const std::vector<DraftRequest>& requests) = 0;
  // Observe, then Propose: the engine's catch-up before each draft. A drafter whose calls each
  // cost a round trip (a remote one) sends both before it waits for either, so a step's draft
  // costs one round trip instead of two. `*observed` receives Observe's status. When it is not
  // OK the result is that error as well and no proposal counts (the engine then isolates the
  // failure per sequence, as after Observe alone); otherwise the result is Propose's.
  virtual StatusOr<std::vector<CandidateTree>> ObserveAndPropose(
      const std::vector<DrafterObservation>& observations,
      const std::vector<DraftRequest>& requests, Status* observed) {
    *observed = Observe(observations);
    if (!observed->ok()) return *observed;
    return Propose(requests);
  }
  // How much per-sequence state the drafter can hold (unbounded by default).
  virtual DrafterCapacity capacity() const { return {}; }
  // Bytes of per-sequence state the drafter holds right now (its caches), for memory reports.
  virtual int64_t StateBytes() const { return 0; }
};

}  // namespace specula
