#include "common/spec/spec_engine.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "common/spec/hidden_backlog.h"
#include "common/spec/hidden_row_store.h"
#include "common/spec/tensor_verifier.h"

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The sequence a ModelRunner::Forward error names: its per-sequence validation messages start
// with "sequence <id>" ("sequence 7: ...", "sequence 7 was not added"). -1 when none is named.
SeqId NamedSequence(const Status& status) {
  const std::string& m = status.message();
  const std::string key = "sequence ";
  for (size_t at = m.find(key); at != std::string::npos; at = m.find(key, at + 1)) {
    size_t i = at + key.size();
    if (i >= m.size() || !std::isdigit(static_cast<unsigned char>(m[i]))) continue;
    SeqId id = 0;
    for (; i < m.size() && std::isdigit(static_cast<unsigned char>(m[i])); ++i) {
      id = id * 10 + (m[i] - '0');
    }
    return id;
  }
  return -1;
}

// Runs `f` (returning Status or StatusOr), turning a LibTorch or standard exception (including
// bad_alloc) into INTERNAL naming `what`: no exception crosses the engine's step.
template <typename F>
auto Guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return InternalError(StrCat(what, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return InternalError(StrCat(what, ": ", e.what()));
  }
}

// Whether a drafter call that failed for a batch of sequences is worth retrying one sequence at a
// time: not when the drafter as a whole is unreachable or late (a remote drafter may even have
// applied a late call, so a retry could observe twice).
bool RetryPerSequence(const Status& status) {
  return status.code() != StatusCode::kUnavailable &&
         status.code() != StatusCode::kDeadlineExceeded && status.code() != StatusCode::kCancelled;
}

// Observe with failures isolated per sequence: the error of each observation (OK for those
// observed). A failed call changed nothing (Drafter::Observe), so each observation is retried
// alone and only those that fail again (one overflowing the drafter's cache) report an error.
// `first`: the batch call's status when the caller has made it already (ObserveAndPropose).
std::vector<Status> ObserveEach(Drafter& drafter, std::vector<DrafterObservation> observations,
                                std::optional<Status> first = std::nullopt) {
  const std::string what = StrCat("drafter '", drafter.name(), "' Observe");
  const Status all =
      first ? *std::move(first) : Guarded(what, [&] { return drafter.Observe(observations); });
  std::vector<Status> result(observations.size(), all);
  if (all.ok() || observations.size() == 1 || !RetryPerSequence(all)) return result;
  for (size_t i = 0; i < observations.size(); ++i) {
    std::vector<DrafterObservation> one;
    one.push_back(std::move(observations[i]));
    result[i] = Guarded(what, [&] { return drafter.Observe(one); });
  }
  return result;
}

// Propose with failures isolated per sequence: one tree per request, a Failed tree where that
// request could not be drafted (the whole call failed and so did its retry alone). `first`: the
// batch call's result when the caller has made it already (ObserveAndPropose).
std::vector<CandidateTree> ProposeEach(
    Drafter& drafter, const std::vector<DraftRequest>& requests,
    std::optional<StatusOr<std::vector<CandidateTree>>> first = std::nullopt) {
  const std::string what = StrCat("drafter '", drafter.name(), "' Propose");
  auto checked = [&](StatusOr<std::vector<CandidateTree>> trees, size_t asked) {
    if (trees.ok() && trees->size() != asked) {
      return StatusOr<std::vector<CandidateTree>>(InternalError(
          StrCat(what, " returned ", trees->size(), " trees for ", asked, " requests")));
    }
    return trees;
  };
  auto call = [&](const std::vector<DraftRequest>& asked) {
    return checked(Guarded(what, [&] { return drafter.Propose(asked); }), asked.size());
  };
  auto all = first ? checked(*std::move(first), requests.size()) : call(requests);
  if (all.ok()) return std::move(*all);
  std::vector<CandidateTree> trees(requests.size(), CandidateTree::Failed(all.status()));
  if (requests.size() == 1 || !RetryPerSequence(all.status())) return trees;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto one = call({requests[i]});
    trees[i] = one.ok() ? std::move((*one)[0]) : CandidateTree::Failed(one.status());
  }
  return trees;
}

}  // namespace

struct SpecEngine::Sequence {
  RequestId id = 0;
  SeqId seq = 0;
  SpecRequest request;
  SequenceRng rng{0};
  bool running = false;     // admitted (its prompt may still be being prefilled)
  bool prefilled = false;   // the whole prompt is in the cache and the first token sampled
  int64_t prompt_done = 0;  // prompt tokens in the target's cache
  int64_t chunk = 0;        // prompt tokens this step prefills
  // What the drafter has not observed yet: tokens appended to the sequence and, per committed
  // chunk (prompt chunks, accepted paths), the target's hidden states at the drafter's layers.
  // Observed just before the sequence's next draft (all of a prompt at once, exactly as after a
  // one-shot prefill), so a sequence the budget leaves at 0 nodes costs its drafter nothing.
  std::vector<int32_t> unobserved_tokens;
  HiddenBacklog unobserved_hidden;
  int64_t unobserved_generated = 0;  // of unobserved_tokens, those after the prompt
  bool drafter_observed = false;     // the drafter has observed something of the sequence
  // Steps the drafter's states were not kept since it last observed (SkipsHiddenRows): it
  // restarts from the tokens after them at its next catch-up (RestartFromRecent).
  bool drafter_context_lost = false;
  int32_t quiet_steps = 0;  // the plan's promise: steps (this one included) without a budget
  std::vector<int32_t> generated;
  Drafter* drafter = nullptr;    // null: no speculation (off, or the drafter failed)
  int64_t drafter_blocks = 0;    // reserved in the drafter's cache (Drafter::capacity)
  int32_t draft_budget = 0;      // tree nodes per step (the step plan's budget)
  double draft_min_reach = 0;    // and the reach a node needs (DraftRequest::min_reach)
  double draft_depth_reach = 0;  // and a depth (DraftRequest::depth_reach)
  SpecRequestStats stats;
  // This step's draft, and what verification kept of it.
  CandidateTree tree;
  int32_t accepted = 0;
};

const char* VerifyPlacementName(VerifyPlacement placement) {
  switch (placement) {
    case VerifyPlacement::kAuto:
      return "auto";
    case VerifyPlacement::kHost:
      return "host";
    case VerifyPlacement::kTensors:
      return "tensors";
  }
  return "unknown";
}

StatusOr<VerifyPlacement> ParseVerifyPlacement(const std::string& name) {
  if (name == "auto") return VerifyPlacement::kAuto;
  if (name == "host") return VerifyPlacement::kHost;
  if (name == "tensors") return VerifyPlacement::kTensors;
  return InvalidArgumentError(
      StrCat("unknown verification placement '", name, "' (valid: auto, host, tensors)"));
}

SpecEngine::SpecEngine(ModelRunner* target, SpecEngineOptions options)
    : target_(target),
      options_(options),
      hidden_store_(std::make_unique<HiddenRowStore>()),
      capacity_({.max_batch_size = options.max_batch_size,
                 .kv_cache_blocks = target->kv_stats().num_blocks,
                 .kv_block_size = target->kv_stats().block_size,
                 .context_length = target->config().max_position_embeddings}) {
  options_.max_step_tokens = std::max<int64_t>(options_.max_step_tokens, 1);
}

SpecEngine::~SpecEngine() {
  for (auto& [id, s] : sequences_) {
    if (s->running && target_->HasSequence(s->seq)) (void)target_->ReleaseSequence(s->seq);
    ReleaseDrafter(*s);
  }
}

Status SpecEngine::AddDrafter(std::unique_ptr<Drafter> drafter) {
  const std::string name = drafter->name();
  if (name.empty() || name == "none") {
    return InvalidArgumentError(StrCat("drafter name '", name, "' is reserved"));
  }
  if (drafters_.count(name))
    return AlreadyExistsError(StrCat("drafter '", name, "' already added"));
  const int64_t layers = target_->config().num_hidden_layers;
  for (int64_t l : drafter->hidden_layers()) {
    if (l < 0 || l > layers) {
      return InvalidArgumentError(StrCat("drafter '", name, "' needs hidden layer ", l,
                                         " but the target has layers 0..", layers));
    }
  }
  drafters_[name] = std::move(drafter);
  return OkStatus();
}

std::vector<std::string> SpecEngine::drafter_names() const {
  std::vector<std::string> names;
  for (const auto& [name, d] : drafters_) names.push_back(name);
  return names;
}

Drafter* SpecEngine::drafter(const std::string& name) const {
  auto it = drafters_.find(name);
  return it == drafters_.end() ? nullptr : it->second.get();
}

Status SpecEngine::Validate(const SpecRequest& r) const {
  RETURN_IF_ERROR(ValidateRequest(target_->config(), r.generation));
  const SpeculationSettings& spec = r.speculation;
  if (spec.max_draft_tokens < 0 || spec.max_draft_tokens > kMaxDraftTokens) {
    return InvalidArgumentError(StrCat("max_draft_tokens must be in [0, ", kMaxDraftTokens,
                                       "], got ", spec.max_draft_tokens));
  }
  if (!spec.drafter.empty() && spec.drafter != "none" && !drafters_.count(spec.drafter)) {
    std::string known;
    for (const auto& [name, d] : drafters_) known += (known.empty() ? "" : ", ") + name;
    return InvalidArgumentError(StrCat("unknown drafter '", spec.drafter, "' (available: none",
                                       known.empty() ? "" : ", ", known, ")"));
  }
  RETURN_IF_ERROR(spec.verify.Validate());
  return capacity_.CheckFits(r);
}

StatusOr<RequestId> SpecEngine::Submit(SpecRequest request) {
  RETURN_IF_ERROR(Validate(request));
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->seq = NewSequenceId();
  s->rng = SequenceRng(request.generation.sampling.seed);
  s->stats.lossy = request.speculation.enabled() && request.speculation.verify.lossy();
  s->request = std::move(request);
  s->draft_budget = s->request.speculation.enabled() ? s->request.speculation.max_draft_tokens : 0;
  const RequestId id = s->id;
  RETURN_IF_ERROR(capacity_.Enqueue(id, s->request));
  sequences_[id] = std::move(s);
  return id;
}

Status SpecEngine::Cancel(RequestId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end() ||
      std::find(cancelled_.begin(), cancelled_.end(), id) != cancelled_.end()) {
    return NotFoundError(StrCat("request ", id, " is not running or waiting"));
  }
  cancelled_.push_back(id);
  return OkStatus();
}

Status SpecEngine::SetDraftBudget(RequestId id, int32_t max_draft_tokens, double min_reach,
                                  double depth_reach, int32_t quiet_steps) {
  auto it = sequences_.find(id);
  if (it == sequences_.end())
    return NotFoundError(StrCat("request ", id, " is not running or waiting"));
  Sequence& s = *it->second;
  const int32_t cap = s.request.speculation.enabled() ? s.request.speculation.max_draft_tokens : 0;
  s.draft_budget = std::clamp(max_draft_tokens, 0, cap);
  s.draft_min_reach = std::isfinite(min_reach) ? std::clamp(min_reach, 0.0, 1.0) : 0.0;
  s.draft_depth_reach = std::isfinite(depth_reach) ? std::max(depth_reach, 0.0) : 0.0;
  s.quiet_steps = s.draft_budget > 0 ? 0 : std::max(quiet_steps, 0);
  return OkStatus();
}

bool SpecEngine::HasWork() const { return !sequences_.empty(); }

int32_t SpecEngine::num_running() const { return capacity_.num_running(); }

int32_t SpecEngine::num_waiting() const { return capacity_.num_waiting(); }

void SpecEngine::Finish(Sequence& s, FinishReason reason, Status error, StepReport* report) {
  // Only an admitted sequence was added to the target: a failed AddSequence (the id in use) must
  // not release someone else's cache.
  if (s.running && target_->HasSequence(s.seq)) (void)target_->ReleaseSequence(s.seq);
  ReleaseDrafter(s);
  // Every sequence is waiting or running in the scheduler until here, so this cannot fail.
  (void)capacity_.Release(s.id);
  // The last update for this request carries the finish; tokens of this step are already in it.
  RequestUpdate* update = nullptr;
  for (auto& u : report->updates) {
    if (u.id == s.id) update = &u;
  }
  if (!update) {
    report->updates.push_back({.id = s.id});
    update = &report->updates.back();
  }
  update->finished = true;
  update->finish_reason = reason;
  update->error = std::move(error);
  update->stats = s.stats;
  sequences_.erase(s.id);
}

void SpecEngine::AdmitWaiting(StepReport* report) {
  // Admission needs batch room and the request's worst-case KV blocks only (CapacityScheduler,
  // FIFO without overtaking): prompts are prefilled in chunks within the step's token budget
  // (PlanChunks), so a long prompt never has to wait for a step of its own.
  while (const std::optional<RequestId> id = capacity_.NextAdmissible()) {
    Sequence& s = *sequences_.at(*id);
    Status added = target_->AddSequence(s.seq);
    if (!added.ok()) {
      Finish(s, FinishReason::kError, added, report);  // leaves the queue; the next one may fit
      continue;
    }
    (void)capacity_.Admit(*id);  // cannot fail: the admissible head
    s.running = true;
    if (s.request.speculation.enabled()) {
      Status st = AttachDrafter(s, drafters_.at(s.request.speculation.drafter).get());
      if (!st.ok()) {  // the request runs without speculation
        ++s.stats.draft_errors;
        s.stats.last_draft_error = st.ToString();
      }
    }
  }
}

// One target forward of the step: the sequences in it, the batch and its output.
struct SpecEngine::ForwardGroup {
  std::vector<Sequence*> members;
  ForwardBatch batch;
  ForwardOutput out;
  std::vector<int64_t> starts;  // each member's cache length before the forward
  // Accepted paths, committed to the KV cache together after every member is verified (one copy
  // for the whole batch), with the member each belongs to.
  std::vector<PathCommit> commits;
  std::vector<Sequence*> committing;
  // Per member: its tree verified on the logits tensor (VerifyPlacement), or empty when the host
  // verifier runs (prefill chunks, lossy rules, host placement).
  std::vector<std::optional<StatusOr<VerifyResult>>> verified;
  // Members whose drafter reads hidden states kept in the store (StoresHiddenRows), and the step
  // rows each keeps (a prompt chunk's, an accepted path's): stored for all of them at once after
  // the commits (FlushHiddenRows).
  std::vector<RequestId> hidden_owners;
  std::vector<std::vector<int64_t>> hidden_rows;
  // Per drafter, the step's hidden-state tensors of its layers, shared by the members' backlogs
  // (HiddenBacklog::AppendShared), made at the first member that keeps rows.
  std::map<const Drafter*, HiddenBacklog::SharedLayers> shared_hidden;
};

namespace {

// The first prompt position whose hidden states a drafter with a bounded context (> 0) reads: a
// prompt longer than the context restarts from its newest `context` tokens before its first
// Observe (SpecEngine::RestartFromRecent), with the states of all but the newest.
int64_t FirstPromptRowKept(size_t prompt_tokens, int64_t context) {
  const auto prompt = static_cast<int64_t>(prompt_tokens);
  return context > 0 && prompt > context ? prompt - (context - 1) : 0;
}

// A step's hidden-state tensors with at most this many rows are kept by the backlogs of its
// sequences (HiddenBacklog::AppendShared) rather than copied into them.
constexpr int64_t kMaxSharedStepRows = 16;

// The step's packed hidden-state tensors of the layers `drafter` reads, in its order.
std::vector<at::Tensor> DrafterLayers(const ForwardBatch& batch, const ForwardOutput& out,
                                      const Drafter& drafter) {
  const std::vector<int64_t>& have = batch.hidden_layers;
  std::vector<at::Tensor> layers;
  for (int64_t l : drafter.hidden_layers()) {
    const auto pos = std::lower_bound(have.begin(), have.end(), l) - have.begin();
    layers.push_back(out.hidden[pos]);
  }
  return layers;
}

}  // namespace

StatusOr<StepReport> SpecEngine::Step() {
  StepReport report;
  try {
    RunStep(&report);
  } catch (const std::exception& e) {
    // Every stage guards its LibTorch and drafter calls; this is the backstop for anything else.
    // The state of the sequences in this step is unknown, so they end; waiting ones stay.
    const Status error = InternalError(StrCat("engine step failed: ", e.what()));
    std::vector<Sequence*> running;
    for (auto& [id, s] : sequences_) {
      if (s->running) running.push_back(s.get());
    }
    for (Sequence* s : running) Finish(*s, FinishReason::kError, error, &report);
  }
  return report;
}

void SpecEngine::RunStep(StepReport* report) {
  FinishCancelled(report);
  AdmitWaiting(report);
  std::vector<Sequence*> decoding, prefilling;  // prefilling in admission (= id) order
  for (auto& [id, s] : sequences_) {
    if (s->running) (s->prefilled ? decoding : prefilling).push_back(s.get());
  }
  if (decoding.empty() && prefilling.empty()) return;

  auto t_draft = Clock::now();
  Draft(decoding, report);
  report->draft_seconds += SecondsSince(t_draft);

  auto t_verify = Clock::now();
  std::vector<Sequence*> members = PlanChunks(decoding, prefilling);
  members.insert(members.end(), decoding.begin(), decoding.end());
  std::vector<ForwardGroup> groups = ForwardIsolating(std::move(members), report);
  for (ForwardGroup& group : groups) {
    for (size_t b = 0; b < group.members.size(); ++b) {
      const int64_t n = static_cast<int64_t>(group.batch.seqs[b].tokens.size());
      ++report->batch_size;
      (group.members[b]->prefilled ? report->verify_tokens : report->prefill_tokens) += n;
      const double attention = static_cast<double>(n) * static_cast<double>(group.starts[b] + n);
      report->attention += attention;
      if (!group.members[b]->prefilled) report->prefill_attention += attention;
    }
    CommitGroup(group, report);
  }
  report->verify_seconds += SecondsSince(t_verify);
}

std::vector<SpecEngine::Sequence*> SpecEngine::PlanChunks(
    const std::vector<Sequence*>& decoding, const std::vector<Sequence*>& prefilling) {
  // The step's token budget: decoding sequences first (pending token + draft tree: a decode
  // never waits for a prompt), then prompt chunks in admission order fill what is left. At least
  // one prompt token is prefilled per step, so a prompt progresses even when decodes fill the
  // budget.
  int64_t left = options_.max_step_tokens;
  for (const Sequence* s : decoding) left -= 1 + s->tree.size();
  std::vector<Sequence*> chunked;
  for (Sequence* s : prefilling) {
    const int64_t remaining =
        static_cast<int64_t>(s->request.generation.prompt.size()) - s->prompt_done;
    int64_t take = std::min(remaining, std::max<int64_t>(left, 0));
    if (chunked.empty()) take = std::max<int64_t>(take, 1);
    s->chunk = take;
    if (take == 0) continue;
    left -= take;
    chunked.push_back(s);
  }
  return chunked;
}

void SpecEngine::FinishCancelled(StepReport* report) {
  for (RequestId id : cancelled_) {
    auto it = sequences_.find(id);
    if (it != sequences_.end()) Finish(*it->second, FinishReason::kCancelled, OkStatus(), report);
  }
  cancelled_.clear();
}

void SpecEngine::DetachWithError(Sequence& s, const Status& error) {
  ++s.stats.draft_errors;
  s.stats.last_draft_error = error.ToString();
  Detach(s);
}

void SpecEngine::DropDraft(Sequence& s, const Status& error) {
  ++s.stats.draft_errors;
  s.stats.last_draft_error = error.ToString();
  s.tree = CandidateTree();
}

int32_t SpecEngine::DraftRoom(const Sequence& s) const {
  return DraftRoomAt(s, target_->HasSequence(s.seq) ? target_->SequenceLength(s.seq) : 0);
}

int32_t SpecEngine::DraftRoomAt(const Sequence& s, int64_t context) const {
  if (!s.drafter || !s.prefilled) return 0;
  // Every accepted draft token plus the target's own must fit max_new_tokens, and the tree's
  // nodes occupy cache positions cached + 1 .. cached + nodes (after the pending token).
  const int64_t cache_room = target_->config().max_position_embeddings - context - 1;
  const int64_t room =
      s.request.generation.max_new_tokens - static_cast<int64_t>(s.generated.size()) - 1;
  return static_cast<int32_t>(std::max<int64_t>(
      0,
      std::min({room, cache_room, static_cast<int64_t>(s.request.speculation.max_draft_tokens)})));
}

Status SpecEngine::AttachDrafter(Sequence& s, Drafter* d) {
  // The drafter's cache is reserved like the target's: the sequence's worst case up front, so a
  // sequence attached here can never overflow it later (issue 19: one overflow used to cost every
  // sequence of the call its speculation).
  const DrafterCapacity capacity = d->capacity();
  const GenerationRequest& g = s.request.generation;
  const int64_t positions =
      std::min<int64_t>(static_cast<int64_t>(g.prompt.size()) + g.max_new_tokens,
                        target_->config().max_position_embeddings);
  const int64_t need = DrafterBlocksReserved(positions, capacity);
  int64_t& reserved = drafter_blocks_[d];
  if (capacity.bounded() && reserved + need > capacity.blocks) {
    return ResourceExhaustedError(StrCat("drafter '", d->name(), "': the sequence needs ", need,
                                         " cache blocks, ", capacity.blocks - reserved, " of ",
                                         capacity.blocks, " are free"));
  }
  RETURN_IF_ERROR(Guarded(StrCat("drafter '", d->name(), "' AddSequence"),
                          [&] { return d->AddSequence(s.seq, g.sampling); }));
  reserved += need;
  s.drafter = d;
  s.drafter_blocks = need;
  if (!d->hidden_layers().empty()) {
    // What the sequence may generate before its drafter catches up or is detached
    // (max_deferred_observation), plus one tree; the prompt's rows before the first catch-up.
    int64_t deferred = std::min<int64_t>(g.max_new_tokens, options_.max_deferred_observation) + 1;
    if (options_.drafter_context > 0) {  // BoundBacklog: at most twice the context, and a tree
      deferred = std::min<int64_t>(deferred, 2 * options_.drafter_context + 1);
    }
    const int64_t prompt_rows = static_cast<int64_t>(g.prompt.size()) -
                                FirstPromptRowKept(g.prompt.size(), options_.drafter_context);
    s.unobserved_hidden.ExpectRows(prompt_rows + deferred, deferred);
  }
  return OkStatus();
}

void SpecEngine::ReleaseDrafter(Sequence& s) {
  if (!s.drafter) return;
  // A drafter's failure to release is its own problem (its state is lost either way).
  (void)Guarded("release", [&] {
    s.drafter->ReleaseSequence(s.seq);
    return OkStatus();
  });
  drafter_blocks_[s.drafter] -= s.drafter_blocks;
  s.drafter_blocks = 0;
  s.drafter = nullptr;
}

void SpecEngine::Detach(Sequence& s) {
  ReleaseDrafter(s);
  s.unobserved_tokens.clear();
  s.unobserved_hidden.Clear();
  s.unobserved_generated = 0;
}

void SpecEngine::Draft(const std::vector<Sequence*>& decoding, StepReport* report) {
  // One catch-up Observe and one batched Propose per drafter.
  std::map<Drafter*, std::vector<Sequence*>> by_drafter;
  for (Sequence* s : decoding) {
    s->tree = CandidateTree();
    s->accepted = 0;
    if (!s->drafter) continue;
    // A drafter whose states were skipped drafts once it has one (two tokens) to start from.
    const bool drafts = s->draft_budget > 0 && DraftRoom(*s) > 0 &&
                        !(s->drafter_context_lost && s->unobserved_tokens.size() < 2);
    const bool hidden = !s->drafter->hidden_layers().empty();
    // A drafter of hidden states with a bounded context keeps a bounded backlog (BoundBacklog):
    // it waits for its next draft, however long.
    const bool deferred_long = s->unobserved_generated >= options_.max_deferred_observation &&
                               !(hidden && options_.drafter_context > 0);
    if (!drafts && deferred_long && hidden) {
      Detach(*s);
      continue;
    }
    if (drafts || deferred_long) by_drafter[s->drafter].push_back(s);
  }
  for (auto& [drafter, members] : by_drafter) DraftWith(drafter, members, report);
}

Status SpecEngine::RestartFromRecent(Sequence& s, int64_t keep) {
  const bool trim = keep > 0 && !s.drafter->hidden_layers().empty() &&
                    static_cast<int64_t>(s.unobserved_tokens.size()) > keep;
  if (!trim && !std::exchange(s.drafter_context_lost, false)) return OkStatus();
  s.drafter_context_lost = false;
  if (trim) {
    // The last `keep` tokens and the states of all but the last (the pending token, whose state
    // the next step computes): what a first Observe of a `keep`-token prompt carries.
    s.unobserved_tokens.erase(s.unobserved_tokens.begin(), s.unobserved_tokens.end() - keep);
    s.unobserved_hidden.KeepNewest(keep - 1);
    s.unobserved_generated = std::min(s.unobserved_generated, keep);
  }
  if (!s.drafter_observed) return OkStatus();  // its first Observe starts it there anyway
  // Its context so far is let go of: it starts over from the recent tokens.
  s.drafter_observed = false;
  Drafter* drafter = s.drafter;
  (void)Guarded("release", [&] {
    drafter->ReleaseSequence(s.seq);
    return OkStatus();
  });
  return Guarded(StrCat("drafter '", drafter->name(), "' AddSequence"),
                 [&] { return drafter->AddSequence(s.seq, s.request.generation.sampling); });
}

void SpecEngine::BoundBacklog(Sequence& s) {
  const int64_t keep = options_.drafter_context;
  if (keep <= 0 || !s.drafter || static_cast<int64_t>(s.unobserved_tokens.size()) <= 2 * keep) {
    return;
  }
  Status restarted = RestartFromRecent(s, keep);
  if (!restarted.ok()) DetachWithError(s, restarted);
}

void SpecEngine::DraftWith(Drafter* drafter, const std::vector<Sequence*>& members,
                           StepReport* report) {
  const auto t0 = Clock::now();
  DrafterCall call{.drafter = drafter->name()};
  // A sequence that cannot be observed goes on without speculation (DetachWithError); the others
  // are unaffected.
  // Catch up: everything committed since each member's last draft, in one Observe.
  std::vector<DrafterObservation> observations;
  std::vector<Sequence*> observing;
  for (Sequence* s : members) {
    if (s->unobserved_tokens.empty()) continue;
    Status restarted = RestartFromRecent(*s, options_.drafter_context);
    if (!restarted.ok()) {
      DetachWithError(*s, restarted);
      continue;
    }
    s->drafter_observed = true;
    DrafterObservation obs{.seq = s->seq, .tokens = std::move(s->unobserved_tokens)};
    call.observed_tokens += static_cast<int64_t>(obs.tokens.size());
    // The chunk path joins device tensors (LibTorch can throw).
    Status joined = Guarded("hidden states", [&] {
      obs.hidden = s->unobserved_hidden.Take();
      return OkStatus();
    });
    s->unobserved_tokens.clear();
    s->unobserved_generated = 0;
    if (!joined.ok()) {
      DetachWithError(*s, joined);
      continue;
    }
    observations.push_back(std::move(obs));
    observing.push_back(s);
  }
  std::vector<DraftRequest> requests;
  std::vector<Sequence*> asked;
  // The members still drafting with this drafter, each with its budget.
  auto plan_requests = [&] {
    requests.clear();
    asked.clear();
    for (Sequence* s : members) {
      if (s->drafter != drafter) continue;
      // The tree's nodes occupy cache positions cached + 1 .. cached + nodes, so the context
      // bounds the node count; accepted tokens plus the target's own must fit max_new_tokens,
      // which bounds the depth.
      const int64_t cache_room =
          target_->config().max_position_embeddings - target_->SequenceLength(s->seq) - 1;
      const int64_t token_room =
          s->request.generation.max_new_tokens - static_cast<int64_t>(s->generated.size()) - 1;
      const int32_t max_nodes =
          static_cast<int32_t>(std::min<int64_t>(cache_room, s->draft_budget));
      const int32_t max_depth = static_cast<int32_t>(std::min<int64_t>(token_room, max_nodes));
      if (max_depth <= 0) continue;  // caught up only
      requests.push_back({.seq = s->seq,
                          .max_nodes = max_nodes,
                          .max_depth = max_depth,
                          .min_reach = s->draft_min_reach,
                          .depth_reach = s->draft_depth_reach});
      asked.push_back(s);
    }
  };
  plan_requests();
  std::optional<StatusOr<std::vector<CandidateTree>>> proposed;
  if (!observations.empty()) {
    // Both calls at once (one round trip for a remote drafter). `status` stays an error when
    // Observe threw, so only a Propose that failed after a good Observe counts as a Propose
    // failure.
    std::optional<Status> observed;
    if (!requests.empty()) {
      Status status(StatusCode::kUnknown, "Observe did not return");
      auto both = Guarded(StrCat("drafter '", drafter->name(), "' Observe + Propose"), [&] {
        return drafter->ObserveAndPropose(observations, requests, &status);
      });
      if (status.ok()) {
        proposed = std::move(both);
      } else {
        observed = std::move(status);
      }
    }
    if (!proposed) {
      const std::vector<Status> results =
          ObserveEach(*drafter, std::move(observations), std::move(observed));
      for (size_t i = 0; i < observing.size(); ++i) {
        if (results[i].ok()) continue;
        // The drafter's state for this sequence is unknown now.
        DetachWithError(*observing[i], results[i]);
      }
      plan_requests();  // without the members just detached
    }
  }
  if (!requests.empty()) {
    std::vector<CandidateTree> trees = ProposeEach(*drafter, requests, std::move(proposed));
    const int32_t vocab = static_cast<int32_t>(target_->config().vocab_size);
    for (size_t i = 0; i < asked.size(); ++i) {
      CandidateTree& tree = trees[i];
      if (!tree.failure().ok()) {  // this sequence alone could not be drafted
        DropDraft(*asked[i], tree.failure());
        continue;
      }
      Status valid = tree.Validate(vocab, requests[i].max_nodes, requests[i].max_depth);
      if (!valid.ok()) {
        DropDraft(*asked[i], valid.WithContext(StrCat("drafter '", drafter->name(), "'")));
        continue;
      }
      asked[i]->tree = std::move(tree);
      call.nodes += asked[i]->tree.size();
      call.max_depth = std::max(call.max_depth, asked[i]->tree.max_depth());
    }
  }
  call.sequences = static_cast<int32_t>(asked.size());
  call.seconds = SecondsSince(t0);
  if (call.sequences > 0 || call.observed_tokens > 0) report->drafter_calls.push_back(call);
}

bool SpecEngine::SkipsHiddenRows(const Sequence& s) const {
  // The drafter's next draft comes quiet_steps steps from now at the earliest and reads the
  // states of the drafter_context - 1 tokens before its pending one, which the steps from
  // quiet_steps - drafter_context + 1 on compute (each undrafted step commits one token).
  return s.prefilled && s.drafter != nullptr && s.draft_budget == 0 &&
         options_.drafter_context > 0 && s.quiet_steps > options_.drafter_context + 1 &&
         !s.drafter->hidden_layers().empty();
}

ForwardBatch SpecEngine::Assemble(const std::vector<Sequence*>& members) const {
  ForwardBatch batch;
  // The union of the members' drafters' layers, sorted (a std::set cost a node allocation per
  // layer every step).
  std::vector<int64_t>& layers = batch.hidden_layers;
  const Drafter* last = nullptr;
  for (Sequence* s : members) {
    if (!s->drafter || s->drafter == last || SkipsHiddenRows(*s)) continue;
    last = s->drafter;
    for (int64_t l : s->drafter->hidden_layers()) {
      const auto at = std::lower_bound(layers.begin(), layers.end(), l);
      if (at == layers.end() || *at != l) layers.insert(at, l);
    }
  }
  for (Sequence* s : members) {
    if (!s->prefilled) {
      // A prompt chunk; only the last one needs logits (it samples the first token).
      const std::vector<int32_t>& prompt = s->request.generation.prompt;
      const int64_t end = s->prompt_done + s->chunk;
      batch.seqs.push_back(
          {.seq = s->seq,
           .tokens = std::vector<int32_t>(prompt.begin() + s->prompt_done, prompt.begin() + end),
           .logits =
               end == static_cast<int64_t>(prompt.size()) ? LogitsRows::kLast : LogitsRows::kNone});
      continue;
    }
    const int64_t start = target_->SequenceLength(s->seq);
    SequenceChunk chunk{.seq = s->seq, .tokens = {s->generated.back()}};
    if (!s->tree.empty()) {
      const CandidateTree& tree = s->tree;
      chunk.positions.push_back(static_cast<int32_t>(start));
      chunk.parents.push_back(-1);
      for (int32_t i = 0; i < tree.size(); ++i) {
        chunk.tokens.push_back(tree.token(i));
        chunk.positions.push_back(static_cast<int32_t>(start + tree.depth(i)));
        chunk.parents.push_back(tree.parent(i) + 1);  // -1 (the pending token) -> row 0
      }
      chunk.logits = LogitsRows::kAll;
    }
    batch.seqs.push_back(std::move(chunk));
  }
  return batch;
}

std::vector<SpecEngine::ForwardGroup> SpecEngine::ForwardIsolating(std::vector<Sequence*> members,
                                                                   StepReport* report) {
  std::vector<ForwardGroup> groups;
  while (!members.empty()) {
    ForwardGroup group;
    group.batch = Assemble(members);
    for (Sequence* s : members) group.starts.push_back(target_->SequenceLength(s->seq));
    const auto t_forward = Clock::now();
    auto out = Guarded("exception", [&] { return target_->Forward(group.batch); });
    report->forward_seconds += SecondsSince(t_forward);
    if (out.ok()) {
      group.members = std::move(members);
      group.out = std::move(*out);
      groups.push_back(std::move(group));
      return groups;
    }
    // ModelRunner rolls back its own failures; an exception that escaped it may not have.
    for (size_t b = 0; b < members.size(); ++b) {
      if (target_->SequenceLength(members[b]->seq) != group.starts[b]) {
        (void)target_->Truncate(members[b]->seq, group.starts[b]);
      }
    }
    const Status error = out.status().WithContext("target forward");
    // One sequence's error (validation names it) costs that sequence its draft, or, when even
    // its plain chunk is refused, the request; the others run again without it.
    const SeqId named = NamedSequence(out.status());
    auto it = std::find_if(members.begin(), members.end(),
                           [&](const Sequence* s) { return s->seq == named; });
    if (it != members.end()) {
      if (!(*it)->tree.empty()) {
        DropDraft(**it, error);
      } else {
        Finish(**it, FinishReason::kError, error, report);
        members.erase(it);
      }
      continue;
    }
    // Not attributable (KV exhausted, a kernel failure): drop the drafts first (they need the
    // most room), then run every sequence alone so a failure ends only its own request.
    bool dropped = false;
    for (Sequence* s : members) {
      if (!s->tree.empty()) {
        DropDraft(*s, error);
        dropped = true;
      }
    }
    if (dropped) continue;
    if (members.size() == 1) {
      Finish(*members[0], FinishReason::kError, error, report);
      return groups;
    }
    for (Sequence* s : members) {
      for (ForwardGroup& g : ForwardIsolating({s}, report)) groups.push_back(std::move(g));
    }
    return groups;
  }
  return groups;
}

bool SpecEngine::VerifiesOnTensors(const at::Tensor& logits) const {
  switch (options_.verify_placement) {
    case VerifyPlacement::kHost:
      return false;
    case VerifyPlacement::kTensors:
      return true;
    case VerifyPlacement::kAuto:
      return !logits.device().is_cpu();
  }
  return false;
}

void SpecEngine::VerifyOnTensors(ForwardGroup& group) {
  group.verified.assign(group.members.size(), std::nullopt);
  std::vector<TreeVerifyJob> jobs;
  std::vector<size_t> owners;
  for (size_t b = 0; b < group.members.size(); ++b) {
    Sequence& s = *group.members[b];
    if (!s.prefilled || s.request.speculation.verify.lossy()) continue;
    jobs.push_back({.tree = &s.tree,
                    .first_row = group.out.logits_offset[b],
                    .sampling = s.request.generation.sampling,
                    .rng = &s.rng});
    owners.push_back(b);
  }
  if (jobs.empty()) return;
  auto results = Guarded("verification", [&]() -> StatusOr<std::vector<StatusOr<VerifyResult>>> {
    return VerifyTreesOnTensors(group.out.logits, jobs);
  });
  for (size_t i = 0; i < owners.size(); ++i) {
    // An exception fails the step's tensor verification; those members' AcceptTree reports it.
    group.verified[owners[i]] =
        results.ok() ? std::move((*results)[i]) : StatusOr<VerifyResult>(results.status());
  }
}

void SpecEngine::CommitGroup(ForwardGroup& group, StepReport* report) {
  if (VerifiesOnTensors(group.out.logits)) VerifyOnTensors(group);
  // Host placement copies every row. Otherwise only the rows the host still reads (prefill
  // samples, lossy rules) cross to the host; a member verified on the tensor needs none there.
  const std::vector<int64_t>& offset = group.out.logits_offset;
  std::vector<int64_t> host_first(offset.begin(), offset.end() - 1);
  std::vector<int64_t> take;
  if (!group.verified.empty()) {
    for (size_t b = 0; b < group.members.size(); ++b) {
      host_first[b] = -1;
      if (group.verified[b].has_value() || offset[b] == offset[b + 1]) continue;
      host_first[b] = static_cast<int64_t>(take.size());
      for (int64_t r = offset[b]; r < offset[b + 1]; ++r) take.push_back(r);
    }
  }
  at::Tensor logits;
  Status copied = Guarded("logits copy", [&] {
    const at::Tensor& all = group.out.logits;
    if (group.verified.empty()) {
      logits = all.to(at::kCPU).contiguous();
    } else if (!take.empty()) {
      const at::Tensor index = at::tensor(take, at::TensorOptions().dtype(at::kLong));
      logits = all.index_select(0, index.to(all.device())).to(at::kCPU).contiguous();
    }
    return OkStatus();
  });
  if (!copied.ok()) {
    for (Sequence* s : group.members) Finish(*s, FinishReason::kError, copied, report);
    return;
  }
  const int64_t vocab = group.out.logits.size(1);
  for (size_t b = 0; b < group.members.size(); ++b) {
    const RequestId id = group.members[b]->id;
    Status committed = Guarded("commit", [&] {
      const float* rows =
          host_first[b] < 0 ? nullptr : logits.data_ptr<float>() + host_first[b] * vocab;
      CommitSequence(group, b, rows, vocab, report);
      return OkStatus();
    });
    if (committed.ok()) continue;
    auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    Finish(*it->second, FinishReason::kError, committed, report);
  }
  FlushHiddenRows(group);
  FlushCommits(group, report);
}

bool SpecEngine::StoresHiddenRows(const ForwardGroup& group) const {
  return !group.out.hidden.empty() &&
         (!group.out.hidden[0].device().is_cpu() || options_.hidden_row_store_on_cpu);
}

void SpecEngine::FlushHiddenRows(ForwardGroup& group) {
  if (group.hidden_owners.empty()) return;
  std::vector<int64_t> all;
  for (const auto& rows : group.hidden_rows) all.insert(all.end(), rows.begin(), rows.end());
  std::vector<int64_t> slots;
  const Status stored = Guarded("hidden-state capture", [&] {
    slots = hidden_store_->Put(group.batch.hidden_layers, group.out.hidden, all);
    return OkStatus();
  });
  size_t offset = 0;
  for (size_t i = 0; i < group.hidden_owners.size(); ++i) {
    const size_t n = group.hidden_rows[i].size();
    std::vector<int64_t> mine;
    if (stored.ok()) mine.assign(slots.begin() + offset, slots.begin() + offset + n);
    offset += n;
    auto it = sequences_.find(group.hidden_owners[i]);
    if (it == sequences_.end() || !it->second->drafter) {  // finished since its commit
      hidden_store_->Free(mine);
      continue;
    }
    Sequence& s = *it->second;
    if (stored.ok()) {
      s.unobserved_hidden.AppendSlots(hidden_store_.get(), s.drafter->hidden_layers(), mine);
      BoundBacklog(s);
      continue;
    }
    // Its drafter would miss these rows: the request goes on without speculation.
    DetachWithError(s, stored);
  }
}

void SpecEngine::FlushCommits(ForwardGroup& group, StepReport* report) {
  // Sequences that finished this step were released already: nothing of theirs to keep.
  std::vector<PathCommit> commits;
  std::vector<Sequence*> owners;
  for (size_t i = 0; i < group.commits.size(); ++i) {
    if (!target_->HasSequence(group.commits[i].seq)) continue;
    commits.push_back(std::move(group.commits[i]));
    owners.push_back(group.committing[i]);
  }
  if (commits.empty()) return;
  Status batched = Guarded("KV commit", [&] { return target_->CommitPaths(commits); });
  if (batched.ok()) return;
  // Isolate the failure: commit one by one, ending only the sequences whose commit fails.
  for (size_t i = 0; i < commits.size(); ++i) {
    Status one = Guarded("KV commit", [&] {
      return target_->KeepOnly(commits[i].seq, commits[i].start, commits[i].offsets);
    });
    if (one.ok()) continue;
    Finish(*owners[i], FinishReason::kError, one.WithContext("KV commit"), report);
  }
}

void SpecEngine::CommitSequence(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                                StepReport* report) {
  Sequence& s = *group.members[b];
  const bool was_prefill = !s.prefilled;
  std::vector<int32_t> emitted;
  std::vector<int64_t> hidden_rows;  // packed rows whose hidden states the drafter observes
  if (was_prefill) {
    if (!CommitPrefillChunk(group, b, rows, vocab, &emitted)) return;  // more chunks to come
  } else {
    Status accepted = AcceptTree(group, b, rows, vocab, &emitted, &hidden_rows);
    if (!accepted.ok()) {
      Finish(s, FinishReason::kError, accepted, report);
      return;
    }
  }
  const std::optional<FinishReason> reason = ApplyStops(s, &emitted);
  RequestUpdate update{.id = s.id, .new_tokens = emitted, .stats = s.stats};
  if (!was_prefill && !s.tree.empty()) {
    update.draft_nodes = s.tree.size();
    update.draft_depth = s.tree.max_depth();
    update.draft_accepted = s.accepted;
  }
  if (reason) {
    report->updates.push_back(std::move(update));
    Finish(s, *reason, OkStatus(), report);
    return;
  }
  if (s.drafter) QueueObservation(group, b, was_prefill, emitted, hidden_rows);
  // The cache after the KV commit: the pending token and the accepted nodes.
  const int64_t context = was_prefill ? s.prompt_done : group.starts[b] + 1 + s.accepted;
  update.context_tokens = context;
  update.unobserved_tokens = static_cast<int64_t>(s.unobserved_tokens.size());
  if (s.drafter && options_.drafter_context > 0 && !s.drafter->hidden_layers().empty()) {
    // What its next catch-up observes (RestartFromRecent).
    update.unobserved_tokens = std::min(update.unobserved_tokens, options_.drafter_context);
  }
  update.max_draft_nodes = DraftRoomAt(s, context);
  report->updates.push_back(std::move(update));
}

bool SpecEngine::CommitPrefillChunk(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                                    std::vector<int32_t>* emitted) {
  Sequence& s = *group.members[b];
  const ForwardOutput& out = group.out;
  const int64_t row0 = out.token_offset[b], row_end = out.token_offset[b + 1];
  const GenerationRequest& g = s.request.generation;
  if (s.drafter && !s.drafter->hidden_layers().empty()) {
    // This chunk's rows, kept until the drafter observes the prompt: with a bounded drafter
    // context, only those a restart from its recent tokens reads (RestartFromRecent: a prompt
    // longer than the context always restarts before its first Observe). A 128-token prompt's
    // rows of SpecFormer's four layers were copied (into new pages) to drop all but 31 of them
    // at its first step.
    const int64_t first =
        row0 + std::max<int64_t>(0, FirstPromptRowKept(g.prompt.size(), options_.drafter_context) -
                                        s.prompt_done);
    if (first < row_end) {
      if (StoresHiddenRows(group)) {  // with every other member's rows, after the commits
        group.hidden_owners.push_back(s.id);
        group.hidden_rows.emplace_back();
        for (int64_t r = first; r < row_end; ++r) group.hidden_rows.back().push_back(r);
      } else {
        s.unobserved_hidden.AppendRange(DrafterLayers(group.batch, group.out, *s.drafter), first,
                                        row_end);
      }
    }
  }
  s.prompt_done += row_end - row0;
  if (s.prompt_done < static_cast<int64_t>(g.prompt.size())) return false;
  emitted->push_back(SampleToken({rows, static_cast<size_t>(vocab)}, g.sampling, s.rng));
  s.prefilled = true;
  return true;
}

Status SpecEngine::AcceptTree(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                              std::vector<int32_t>* emitted, std::vector<int64_t>* hidden_rows) {
  // Verify the tree, commit the accepted path to the KV cache, count the draft's stats.
  Sequence& s = *group.members[b];
  const CandidateTree& tree = s.tree;
  const int64_t row0 = group.out.token_offset[b];
  StatusOr<VerifyResult> verified = InternalError("not verified");
  if (b < group.verified.size() && group.verified[b].has_value()) {
    verified = std::move(*group.verified[b]);
  } else {
    TreeLogits tree_logits{.data = rows, .rows = tree.size() + 1, .vocab = vocab};
    verified = VerifyTree(tree, tree_logits, s.request.generation.sampling,
                          s.request.speculation.verify, s.rng);
  }
  if (!verified.ok()) return verified.status().WithContext("verification");
  std::vector<int64_t> offsets = {0};
  hidden_rows->push_back(row0);
  for (int32_t node : verified->accepted_nodes) {
    emitted->push_back(tree.token(node));
    offsets.push_back(node + 1);
    hidden_rows->push_back(row0 + node + 1);
  }
  emitted->push_back(verified->bonus_token);
  if (!tree.empty()) {
    group.commits.push_back({.seq = s.seq, .start = group.starts[b], .offsets = offsets});
    group.committing.push_back(&s);
    ++s.stats.draft_steps;
    s.stats.draft_tokens += tree.size();
    s.stats.draft_depth += tree.max_depth();
    const int64_t accepted = static_cast<int64_t>(verified->accepted_nodes.size());
    s.accepted = static_cast<int32_t>(accepted);
    s.stats.accepted_tokens += accepted;
    if (static_cast<int64_t>(s.stats.accepted_per_position.size()) < tree.max_depth()) {
      s.stats.accepted_per_position.resize(tree.max_depth(), 0);
    }
    for (int64_t d = 0; d < accepted; ++d) ++s.stats.accepted_per_position[d];
  }
  ++s.stats.steps;
  return OkStatus();
}

std::optional<FinishReason> SpecEngine::ApplyStops(Sequence& s, std::vector<int32_t>* emitted) {
  // Stop conditions apply token by token: nothing after a stop token or past max_new_tokens.
  const GenerationRequest& g = s.request.generation;
  std::optional<FinishReason> reason;
  size_t keep = 0;
  for (; keep < emitted->size(); ++keep) {
    const int32_t t = (*emitted)[keep];
    s.generated.push_back(t);
    if (std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), t) != g.stop_token_ids.end()) {
      reason = FinishReason::kStop;
    } else if (static_cast<int64_t>(s.generated.size()) >= g.max_new_tokens) {
      reason = FinishReason::kLength;
    }
    if (reason) {
      ++keep;
      break;
    }
  }
  emitted->resize(keep);
  return reason;
}

void SpecEngine::QueueObservation(ForwardGroup& group, size_t b, bool was_prefill,
                                  const std::vector<int32_t>& emitted,
                                  const std::vector<int64_t>& hidden_rows) {
  Sequence& s = *group.members[b];
  if (was_prefill) {
    // The prompt's chunks are in unobserved_hidden already (CommitPrefillChunk).
    const std::vector<int32_t>& prompt = s.request.generation.prompt;
    s.unobserved_tokens.insert(s.unobserved_tokens.end(), prompt.begin(), prompt.end());
  } else if (SkipsHiddenRows(s)) {
    // No states of this step: the drafter restarts from the tokens after it (the pending one).
    s.unobserved_tokens.clear();
    s.unobserved_hidden.Clear();
    s.unobserved_generated = 0;
    s.drafter_context_lost = true;
  } else if (!s.drafter->hidden_layers().empty()) {
    if (StoresHiddenRows(group)) {  // one store for the whole group after the commits
      group.hidden_owners.push_back(s.id);
      group.hidden_rows.push_back(hidden_rows);
    } else if (!group.out.hidden.empty() && group.out.hidden[0].size(0) <= kMaxSharedStepRows) {
      // A small step's tensors are kept, shared, instead of copied: what an idle sequence holds
      // alive is then at most kMaxSharedStepRows rows a step, whoever else's they are.
      HiddenBacklog::SharedLayers& layers = group.shared_hidden[s.drafter];
      if (!layers) {  // once per drafter per step
        std::vector<at::Tensor> kept = DrafterLayers(group.batch, group.out, *s.drafter);
        for (at::Tensor& t : kept) {
          if (!t.is_contiguous()) t = t.contiguous();
        }
        layers = std::make_shared<const std::vector<at::Tensor>>(std::move(kept));
      }
      s.unobserved_hidden.AppendShared(layers, hidden_rows);
    } else {
      s.unobserved_hidden.AppendRows(DrafterLayers(group.batch, group.out, *s.drafter),
                                     hidden_rows);
    }
  }
  s.unobserved_tokens.insert(s.unobserved_tokens.end(), emitted.begin(), emitted.end());
  s.unobserved_generated += static_cast<int64_t>(emitted.size());
  if (!was_prefill && s.quiet_steps > 0) --s.quiet_steps;
  // With the store, this step's rows join the backlog after the commits (FlushHiddenRows).
  if (!StoresHiddenRows(group)) BoundBacklog(s);
}

int64_t SpecEngine::DrafterStateBytes() const {
  int64_t bytes = 0;
  for (const auto& [name, drafter] : drafters_) bytes += drafter->StateBytes();
  return bytes;
}

StatusOr<std::vector<SpecGenerationResult>> GenerateAll(SpecEngine& engine,
                                                        const std::vector<SpecRequest>& requests,
                                                        const SpecTokenCallback& on_tokens,
                                                        SpecRunStats* stats,
                                                        BudgetPlanner* planner) {
  for (size_t i = 0; i < requests.size(); ++i) {
    Status s = engine.Validate(requests[i]);
    if (!s.ok()) return s.WithContext(StrCat("request ", i));
  }
  SpecRunStats local;
  SpecRunStats& st = stats ? *stats : local;
  st = SpecRunStats{};
  auto t0 = Clock::now();
  std::vector<SpecGenerationResult> results(requests.size());
  std::unordered_map<RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSIGN_OR_RETURN(RequestId id, engine.Submit(requests[i]));
    index[id] = i;
    if (planner) planner->Admit(id, requests[i]);
  }
  Status failure;
  while (engine.HasWork()) {
    const auto t_step = Clock::now();
    if (planner) {
      for (const StepPlan::DraftBudget& b : planner->Plan()) {
        (void)engine.SetDraftBudget(b.id, b.max_draft_tokens, b.min_reach, b.depth_reach,
                                    b.quiet_steps);
        st.budget_nodes += b.max_draft_tokens;
        ++st.budgeted_sequence_steps;
      }
    }
    ASSIGN_OR_RETURN(StepReport report, engine.Step());
    if (planner) planner->OnStep(report, SecondsSince(t_step));
    ++st.steps;
    st.peak_drafter_state_bytes = std::max(st.peak_drafter_state_bytes, engine.DrafterStateBytes());
    st.peak_step_tokens =
        std::max(st.peak_step_tokens, report.prefill_tokens + report.verify_tokens);
    st.draft_seconds += report.draft_seconds;
    st.verify_seconds += report.verify_seconds;
    st.forward_seconds += report.forward_seconds;
    for (RequestUpdate& u : report.updates) {
      auto it = index.find(u.id);
      if (it == index.end()) continue;  // a request submitted by someone else
      SpecGenerationResult& r = results[it->second];
      r.result.tokens.insert(r.result.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      st.generated_tokens += static_cast<int64_t>(u.new_tokens.size());
      r.stats = u.stats;
      if (on_tokens && !u.new_tokens.empty()) on_tokens(it->second, u.new_tokens);
      if (u.finished) {
        r.result.finish_reason = u.finish_reason;
        if (!u.error.ok() && failure.ok()) {
          failure = u.error.WithContext(StrCat("request ", it->second));
        }
      }
    }
  }
  st.seconds = SecondsSince(t0);
  if (!failure.ok()) return failure;
  return results;
}

}  // namespace specula
