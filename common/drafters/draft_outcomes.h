// A drafter's proposals compared with the tokens committed after them, so that it can measure how
// often its nodes are accepted without help from the verifier: node j of a proposal is a trial of
// "accepted, given nodes 1..j-1 were" once 1..j-1 matched the committed tokens. For a
// deterministic draft that is exactly its acceptance, greedy or sampled (rejection sampling keeps
// a drafted token iff the committed token equals it: on a rejection the residual distribution
// gives that token no mass). Each node carries a class (the n-gram drafter's match length, the
// draft LM's confidence bin) that its trial is recorded under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace specula {

class DraftOutcomes {
 public:
  static constexpr size_t kMaxDepth = 16;  // nodes measured per proposal
  // record(cls, j, accepted): a trial of node j (1-based) of a proposal, under its class.
  using Record = std::function<void(int32_t cls, int32_t j, bool accepted)>;

  // A proposal made when the sequence was `at` tokens long: `chain[0]` drafts the token at
  // position `at`. `classes` has one entry per node (a shorter list repeats its last entry). A
  // second proposal at the same position (a retried step) replaces the first.
  void Proposed(int64_t at, std::vector<int32_t> chain, std::vector<int32_t> classes);
  // The token at `position` was committed: every pending proposal it continues gets a trial.
  void Committed(int64_t position, int32_t token, const Record& record);

 private:
  struct Pending {
    int64_t at = 0;
    std::vector<int32_t> chain;
    std::vector<int32_t> classes;
    int32_t matched = 0;  // leading tokens of chain committed so far
  };
  static constexpr size_t kMaxPending = 8;  // a run of proposals that all keep matching
  std::vector<Pending> pending_;
};

}  // namespace specula
