// The drafter conformance suite: what every drafter must do, checked on every variant the
// drafter registry has (n-gram, the draft LM as chain and tree, SpecFormer as tree and chain,
// Beagle's dynamic tree and chain, ParallelSpec's three shapes with and without target features,
// SpecDec), each loaded through the registry from a random checkpoint:
//   - greedy speculative decoding equals plain greedy decoding (batch 1 and a ragged batch);
//   - observing a history in ragged rounds leaves the drafter where one observation of the whole
//     history does (its caches equal a recompute: the next drafts are the same);
//   - trees respect every budget, and a batched Propose equals one Propose per sequence;
//   - sampled requests get valid trees whose attached proposals are distributions holding their
//     node's token, and sampled decoding keeps the target's distribution (chi-square);
//   - bad input gets the documented error and changes nothing.
// The same tests run in two binaries: with the drafter in process (drafter_conformance_test) and
// behind a Drafter service on 127.0.0.1 through RemoteDrafter (remote_drafter_conformance_test).
// Each binary defines MakeConformanceProvider().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/model/model_runner.h"
#include "common/spec/drafter.h"

namespace specula {

// One registry variant with the flags that select it.
struct ConformanceCase {
  std::string label;               // what failures print, e.g. "draft-model tree"
  std::string drafter;             // the registry name
  std::vector<std::string> flags;  // extra flags, e.g. {"--tree-width=3"}
  // Its drafts depend only on the history, not on the rounds it arrived in. False for a draft
  // LM with a context window: one that fell further behind than the window starts over from its
  // recent tokens, one that kept up reads on from where it started (both lossless).
  bool path_independent = true;
};

// Puts a drafter where the engine will reach it: itself (local), or behind a Drafter service.
class DrafterProvider {
 public:
  virtual ~DrafterProvider() = default;
  virtual bool remote() const = 0;
  // The top-k cut-off sampled proposals arrive with (0 = dense): the drafter service's.
  virtual int32_t proposal_top_k() const { return 0; }
  // `drafter`, for a target of `target`'s config, as the engine will call it.
  virtual std::unique_ptr<Drafter> Provide(std::unique_ptr<Drafter> drafter,
                                           const ModelRunner& target) = 0;
};

std::unique_ptr<DrafterProvider> MakeConformanceProvider();

}  // namespace specula
