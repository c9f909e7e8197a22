#include "common/drafters/draft_model_drafter.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <span>

#include "common/drafters/draft_outcomes.h"
#include "common/drafters/draft_sampling.h"
#include "common/spec/proposal.h"

namespace specula {
namespace {

// Per-sequence state (DraftModelDrafter::State is this; free helpers below work on it).
struct SeqState {
  SeqState(SeqId id, const SamplingParams& params)
      : draft_seq(id), sampling(params), rng(DraftSeed(params.seed)) {}

  SeqId draft_seq;  // the draft runner's id for the sequence (process-unique, not the engine's)
  SamplingParams sampling;
  SequenceRng rng;
  std::vector<int32_t> history;  // every token of the sequence; the last one is pending
  // The history index of the draft runner's position 0 (DraftModelDrafterOptions::context).
  int64_t offset = 0;
  // The tokens whose keys/values the draft runner holds for `draft_seq`, by position. Always a
  // prefix of the history from `offset` followed by drafted chain tokens; its size equals the
  // runner's sequence length outside Propose.
  std::vector<int32_t> cached;
  DraftOutcomes outcomes;  // its chains, compared with the tokens committed after them
};

// One sequence being drafted in a Propose call.
struct Work {
  size_t request = 0;
  SeqState* st = nullptr;
  int64_t H = 0;          // history length
  int64_t cache_H = 0;    // of it, the tokens the draft runner reads (from st->offset)
  int32_t max_nodes = 0;  // tree budget
  int32_t max_depth = 0;
  int32_t proposal_top_k = 0;  // sampled chains: proposals cut to their top k (0 = dense)
  CandidateTree tree;
  std::vector<double> path_prob;  // per node: product of draft probabilities from the root
  std::vector<int32_t> frontier;  // tree mode: nodes whose children the next forward computes
  // Chains: the calibration its nodes are judged by, the prices a node and a depth must pay
  // (DraftRequest::min_reach, depth_reach), each node's confidence bin, and the estimated reach
  // of the last node. `kept`: nodes returned (the chain was cut below min_reach; -1 = all).
  const ConfidenceCalibration* calibration = nullptr;
  double min_reach = 0;
  double depth_reach = 0;
  std::vector<int32_t> bins;
  double reach = 1;
  int32_t kept = -1;
};

// Host copy of the logits; row r of sequence b is at offsets[b] + r.
struct HostLogits {
  at::Tensor logits;
  std::vector<int64_t> offsets;
  int64_t vocab = 0;

  std::span<const float> Row(size_t b, int64_t r = 0) const {
    return {logits.data_ptr<float>() + (offsets[b] + r) * vocab, static_cast<size_t>(vocab)};
  }
};

StatusOr<HostLogits> RunForward(ModelRunner& model, const ForwardBatch& batch) {
  StatusOr<ForwardOutput> out = model.Forward(batch);
  if (!out.ok()) return out.status().WithContext("draft model");
  HostLogits h;
  h.logits = out->logits.to(at::kCPU).contiguous();
  h.offsets = std::move(out->logits_offset);
  h.vocab = h.logits.size(1);
  return h;
}

// Brings every sequence's draft cache in line with its history (keeping the longest cached prefix
// that is still right, and always re-running the pending token), then runs the rest of each
// history in one batched forward. Returns the logits after each sequence's pending token.
StatusOr<HostLogits> CatchUp(ModelRunner& model, const std::vector<Work*>& works) {
  ForwardBatch batch;
  for (size_t b = 0; b < works.size(); ++b) {
    SeqState& st = *works[b]->st;
    const auto h = st.history.begin() + st.offset;
    const size_t limit = std::min(st.cached.size(), st.history.size() - st.offset - 1);
    size_t keep = 0;
    while (keep < limit && st.cached[keep] == h[keep]) ++keep;
    if (model.SequenceLength(st.draft_seq) != static_cast<int64_t>(keep)) {
      RETURN_IF_ERROR(model.Truncate(st.draft_seq, static_cast<int64_t>(keep)));
    }
    st.cached.resize(keep);
    batch.seqs.push_back({.seq = st.draft_seq,
                          .tokens = std::vector<int32_t>(h + keep, st.history.end()),
                          .logits = LogitsRows::kLast});
  }
  ASSIGN_OR_RETURN(HostLogits out, RunForward(model, batch));
  // Each cache held the kept prefix; it now also holds what the forward appended.
  for (Work* w : works) {
    SeqState& st = *w->st;
    st.cached.insert(st.cached.end(), st.history.begin() + st.offset + st.cached.size(),
                     st.history.end());
  }
  return out;
}

// Where the draft runner's cache of `st` starts (DraftModelDrafterOptions::context): over again
// from the last `window` tokens when catching up would read more than that, and from the last
// min(window, limit / 2) when the history from the current start outgrows the draft LM's position
// limit (half, so that a restart leaves room to draft for a while).
void ChooseOffset(SeqState& st, int64_t window, int64_t position_limit) {
  const int64_t H = static_cast<int64_t>(st.history.size());
  const int64_t behind = H - st.offset - static_cast<int64_t>(st.cached.size());
  int64_t keep = -1;
  if (window > 0 && behind > window) keep = window;
  if (H - st.offset > position_limit) {
    keep = std::max<int64_t>(1, std::min(window > 0 ? window : position_limit, position_limit / 2));
  }
  if (keep < 0 || keep >= H - st.offset) return;
  st.offset = H - keep;
  st.cached.clear();  // CatchUp truncates the runner to match
}

// Adds the chain's next node from the logits after its current end, and judges it: the chain's
// estimated reach times the node's calibrated acceptance; below min_reach the chain ends before it
// (the node is still measured: its token is known).
void ExtendChain(Work& w, std::span<const float> row) {
  const int32_t parent = w.tree.size() - 1;
  int32_t node = 0;
  if (w.st->sampling.greedy()) {
    const TopToken top = ArgmaxWithProbability(row);
    node = w.tree.AddNode(parent, top.token, top.prob);
  } else {
    node = AddSampledNode(w.tree, parent, Probabilities(row, w.st->sampling), w.proposal_top_k,
                          w.st->rng);
  }
  const int32_t bin = ConfidenceCalibration::BinOf(w.tree.draft_prob(node));
  w.bins.push_back(bin);
  w.reach *= w.calibration->Conditional(bin);
  if (w.kept < 0 && w.min_reach > 0 && w.reach < w.min_reach) w.kept = node;
}

Status DraftChains(ModelRunner& model, std::vector<Work>& works) {
  const int64_t context = model.config().max_position_embeddings;
  std::vector<Work*> members;
  for (Work& w : works) members.push_back(&w);
  ASSIGN_OR_RETURN(HostLogits root, CatchUp(model, members));
  for (size_t b = 0; b < members.size(); ++b) ExtendChain(*members[b], root.Row(b));

  while (true) {
    ForwardBatch batch;
    members.clear();
    // A depth runs if the nodes it would add are expected to reach far enough, in all, to pay
    // for the forward (the chains' reach so far times an average node's acceptance).
    double expected_reach = 0, depth_price = 0;
    for (Work& w : works) {
      const int32_t limit = std::min(w.max_nodes, w.max_depth);
      // One more token must fit in the draft model's context.
      if (w.kept >= 0 || w.tree.size() >= limit ||
          static_cast<int64_t>(w.st->cached.size()) + 1 > context) {
        continue;
      }
      const double next_reach = w.reach * w.calibration->Average();
      if (w.min_reach > 0 && next_reach < w.min_reach) continue;  // it would be cut anyway
      expected_reach += next_reach;
      depth_price = std::max(depth_price, w.depth_reach);
      batch.seqs.push_back({.seq = w.st->draft_seq, .tokens = {w.tree.tokens().back()}});
      members.push_back(&w);
    }
    if (members.empty() || expected_reach < depth_price) return OkStatus();
    ASSIGN_OR_RETURN(HostLogits out, RunForward(model, batch));
    for (size_t b = 0; b < members.size(); ++b) {
      Work& w = *members[b];
      w.st->cached.push_back(w.tree.tokens().back());
      ExtendChain(w, out.Row(b));
    }
  }
}

struct Candidate {
  double path_prob;
  int32_t parent;
  int32_t token;
  float prob;
};

// Adds the best candidates (stable by path probability) within the budget; the first tree_width
// added become the next frontier.
void AddBest(Work& w, std::vector<Candidate>& cands, int32_t tree_width) {
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    return a.path_prob > b.path_prob;
  });
  w.frontier.clear();
  for (const Candidate& c : cands) {
    if (w.tree.size() >= w.max_nodes) break;
    const int32_t node = w.tree.AddNode(c.parent, c.token, c.prob);
    w.path_prob.push_back(c.path_prob);
    if (static_cast<int32_t>(w.frontier.size()) < tree_width) w.frontier.push_back(node);
  }
}

// The top-w children of `parent` (whose path probability is `parent_prob`) from its logits row.
void AppendChildren(const Work& w, std::span<const float> row, int32_t parent, double parent_prob,
                    int32_t tree_width, std::vector<Candidate>& cands) {
  const std::vector<float> probs = DraftProbabilities(row, w.st->sampling);
  for (int32_t token : TopTokens(row, tree_width)) {
    cands.push_back({parent_prob * probs[token], parent, token, probs[token]});
  }
}

Status DraftTrees(ModelRunner& model, std::vector<Work>& works, int32_t tree_width) {
  const int64_t context = model.config().max_position_embeddings;
  std::vector<Work*> members;
  for (Work& w : works) members.push_back(&w);
  ASSIGN_OR_RETURN(HostLogits root, CatchUp(model, members));
  for (size_t b = 0; b < members.size(); ++b) {
    std::vector<Candidate> cands;
    AppendChildren(*members[b], root.Row(b), -1, 1.0, tree_width, cands);
    AddBest(*members[b], cands, tree_width);
  }

  // Each deeper level: the frontier's ancestors (themselves included) run as one token tree on top
  // of the committed history, since a tree chunk only sees the cache plus its own ancestors.
  for (int32_t depth = 2;; ++depth) {
    ForwardBatch batch;
    members.clear();
    for (Work& w : works) {
      if (depth > w.max_depth || w.tree.size() >= w.max_nodes || w.frontier.empty()) continue;
      std::vector<bool> in_chunk(w.tree.size(), false);
      for (int32_t f : w.frontier) {
        for (int32_t a = f; a >= 0 && !in_chunk[a]; a = w.tree.parent(a)) in_chunk[a] = true;
      }
      std::vector<int32_t> nodes, chunk_index(w.tree.size(), -1);
      for (int32_t i = 0; i < w.tree.size(); ++i) {
        if (!in_chunk[i]) continue;
        chunk_index[i] = static_cast<int32_t>(nodes.size());
        nodes.push_back(i);
      }
      if (w.cache_H + static_cast<int64_t>(nodes.size()) > context) continue;  // a shorter tree
      // Drop the previous level's scratch nodes.
      if (model.SequenceLength(w.st->draft_seq) > w.cache_H)
        RETURN_IF_ERROR(model.Truncate(w.st->draft_seq, w.cache_H));
      SequenceChunk chunk{.seq = w.st->draft_seq, .logits = LogitsRows::kExplicit};
      for (int32_t i : nodes) {
        chunk.tokens.push_back(w.tree.token(i));
        // The pending token (runner position cache_H - 1) is the last committed one: depth d
        // sits at cache_H - 1 + d.
        chunk.positions.push_back(static_cast<int32_t>(w.cache_H - 1 + w.tree.depth(i)));
        const int32_t p = w.tree.parent(i);
        chunk.parents.push_back(p < 0 ? -1 : chunk_index[p]);
      }
      for (int32_t f : w.frontier) chunk.logit_rows.push_back(chunk_index[f]);
      batch.seqs.push_back(std::move(chunk));
      members.push_back(&w);
    }
    if (members.empty()) return OkStatus();
    ASSIGN_OR_RETURN(HostLogits out, RunForward(model, batch));
    for (size_t b = 0; b < members.size(); ++b) {
      Work& w = *members[b];
      std::vector<Candidate> cands;
      for (size_t r = 0; r < w.frontier.size(); ++r) {
        const int32_t f = w.frontier[r];
        AppendChildren(w, out.Row(b, static_cast<int64_t>(r)), f, w.path_prob[f], tree_width,
                       cands);
      }
      AddBest(w, cands, tree_width);
    }
  }
}

}  // namespace

struct DraftModelDrafter::State : SeqState {
  using SeqState::SeqState;
};

StatusOr<std::unique_ptr<DraftModelDrafter>> DraftModelDrafter::Create(
    std::unique_ptr<ModelRunner> model, int32_t target_vocab_size,
    DraftModelDrafterOptions options) {
  if (!model) return InvalidArgumentError("draft model is null");
  const int64_t vocab = model->config().vocab_size;
  if (vocab != target_vocab_size) {
    return InvalidArgumentError(StrCat("draft model vocabulary size ", vocab,
                                       " differs from the target's ", target_vocab_size));
  }
  if (options.tree_width < 1) {
    return InvalidArgumentError(StrCat("tree_width must be >= 1, got ", options.tree_width));
  }
  if (options.context < 0) {
    return InvalidArgumentError(StrCat("context must be >= 0 (0 = all), got ", options.context));
  }
  if (options.draft_vocab) {
    RETURN_IF_ERROR(options.draft_vocab->Validate("draft vocabulary"));
    RETURN_IF_ERROR(options.draft_vocab->CheckTarget(vocab, "draft vocabulary"));
    RETURN_IF_ERROR(model->RestrictVocabulary(options.draft_vocab->tokens));
  }
  return std::unique_ptr<DraftModelDrafter>(new DraftModelDrafter(std::move(model), options));
}

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<ModelRunner> model,
                                     DraftModelDrafterOptions options)
    : model_(std::move(model)), options_(options) {}

DraftModelDrafter::~DraftModelDrafter() {
  for (const auto& [seq, state] : states_) (void)model_->ReleaseSequence(state->draft_seq);
}

Status DraftModelDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  if (states_.count(seq)) return AlreadyExistsError(StrCat("sequence ", seq, " was already added"));
  RETURN_IF_ERROR(sampling.Validate());
  const SeqId draft_seq = NewSequenceId();
  RETURN_IF_ERROR(model_->AddSequence(draft_seq));
  states_.emplace(seq, std::make_unique<State>(draft_seq, sampling));
  return OkStatus();
}

void DraftModelDrafter::ReleaseSequence(SeqId seq) {
  auto it = states_.find(seq);
  if (it == states_.end()) return;
  (void)model_->ReleaseSequence(it->second->draft_seq);
  states_.erase(it);
}

Status DraftModelDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  RETURN_IF_ERROR(CheckTokenObservations(observations, model_->config().vocab_size,
                                         [&](SeqId seq) { return states_.count(seq) > 0; }));
  for (const auto& o : observations) {
    State& st = *states_.at(o.seq);
    ConfidenceCalibration& calibration = calibration_[!st.sampling.greedy()];
    const DraftOutcomes::Record record = [&](int32_t bin, int32_t, bool accepted) {
      calibration.Record(bin, accepted);
    };
    for (int32_t t : o.tokens) {
      st.outcomes.Committed(static_cast<int64_t>(st.history.size()), t, record);
      st.history.push_back(t);
    }
  }
  return OkStatus();
}

StatusOr<std::vector<CandidateTree>> DraftModelDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.count(seq) > 0; }));
  std::vector<CandidateTree> trees(requests.size());
  const int64_t context = model_->config().max_position_embeddings;
  std::vector<Work> works;
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    State& st = *states_.at(r.seq);
    const int64_t H = static_cast<int64_t>(st.history.size());
    // Nothing to draft from or no budget: an empty tree.
    if (r.max_nodes <= 0 || r.max_depth <= 0 || H == 0) continue;
    ChooseOffset(st, options_.context, context);
    Work w;
    w.request = i;
    w.st = &st;
    w.H = H;
    w.cache_H = H - st.offset;
    w.max_nodes = r.max_nodes;
    w.max_depth = r.max_depth;
    w.proposal_top_k = r.proposal_top_k;
    w.calibration = &calibration_[!st.sampling.greedy()];
    w.min_reach = r.min_reach;
    w.depth_reach = r.depth_reach;
    works.push_back(std::move(w));
  }
  if (works.empty()) return trees;

  // An exception (a logits copy, an allocation) must not skip the truncation below: the runner
  // would keep scratch tokens and every later draft of these sequences would be wrong.
  Status status;
  try {
    status = options_.tree_width == 1 ? DraftChains(*model_, works)
                                      : DraftTrees(*model_, works, options_.tree_width);
  } catch (const c10::Error& e) {
    status = InternalError(StrCat("draft model forward failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    status = InternalError(StrCat("draft model forward failed: ", e.what()));
  }
  // Whatever happened, the runner holds exactly the tracked tokens again (tree levels are scratch).
  for (Work& w : works) {
    const int64_t tracked = static_cast<int64_t>(w.st->cached.size());
    if (model_->SequenceLength(w.st->draft_seq) > tracked) {
      Status s = model_->Truncate(w.st->draft_seq, tracked);
      if (status.ok()) status = s;
    }
  }
  RETURN_IF_ERROR(status);
  for (Work& w : works) {
    if (!w.bins.empty()) {  // a chain: every drafted node is measured, the cut ones too
      w.st->outcomes.Proposed(w.H, w.tree.tokens(), std::move(w.bins));
      if (w.kept >= 0) w.tree.Truncate(w.kept);
    }
    trees[w.request] = std::move(w.tree);
  }
  return trees;
}

}  // namespace specula
