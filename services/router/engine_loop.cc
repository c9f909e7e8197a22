#include "services/router/engine_loop.h"

#include <algorithm>
#include <utility>

#include "common/engine/plain_decoder.h"
#include "common/tokenizer/stream_decoder.h"
#include "services/router/stop_strings.h"

namespace specula::router {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// A request the engine knows about (loop thread only).
struct EngineLoop::Active {
  Active(const Tokenizer& tokenizer, LoopRequest r, std::shared_ptr<RequestChannel> c)
      : request(std::move(r)),
        channel(std::move(c)),
        decoder(tokenizer, /*skip_special_tokens=*/true),
        stops(request.stop_strings),
        last_delivery(request.arrival) {}

  LoopRequest request;
  std::shared_ptr<RequestChannel> channel;
  StreamDecoder decoder;
  StopStringMatcher stops;
  Clock::time_point last_delivery;
  bool first_token_delivered = false;
  int64_t completion_tokens = 0;
  SpecRequestStats stats;  // the engine's running totals so far
  // Status to report once the engine confirms a cancellation we asked for.
  Status cancel_status;
  bool cancelling = false;
  // The last event is delivered (a stop string matched); the engine still has to drop the request.
  bool delivered = false;
};

StatusOr<std::unique_ptr<EngineLoop>> EngineLoop::Create(ServedModel model,
                                                         EngineLoopOptions options,
                                                         RouterMetrics* metrics) {
  if (!model.target || !model.tokenizer || !model.engine) {
    return InvalidArgumentError("the served model needs a target, a tokenizer and an engine");
  }
  if (options.max_queue < 1) {
    return InvalidArgumentError(StrCat("max_queue must be at least 1, got ", options.max_queue));
  }
  if (options.default_max_draft_tokens < 0) {
    return InvalidArgumentError(
        StrCat("the default draft length must be >= 0, got ", options.default_max_draft_tokens));
  }
  options.verify_defaults.mode = VerifyMode::kLossless;
  RETURN_IF_ERROR(options.verify_defaults.Validate());
  if (options.default_drafter.empty()) options.default_drafter = "none";
  if (options.default_drafter != "none" && !model.engine->drafter(options.default_drafter)) {
    std::string known = "none";
    for (const std::string& d : model.engine->drafter_names()) known += ", " + d;
    return InvalidArgumentError(StrCat("default drafter '", options.default_drafter,
                                       "' is not loaded (loaded: ", known, ")"));
  }
  return std::unique_ptr<EngineLoop>(new EngineLoop(std::move(model), std::move(options), metrics));
}

EngineLoop::EngineLoop(ServedModel model, EngineLoopOptions options, RouterMetrics* metrics)
    : model_(std::move(model)), options_(std::move(options)), metrics_(metrics) {
  const ModelConfig& config = model_.target->config();
  info_.model_name = model_.name;
  info_.model_path = model_.path;
  info_.model_type = config.model_type;
  info_.vocab_size = static_cast<int32_t>(config.vocab_size);
  info_.context_length = static_cast<int32_t>(config.max_position_embeddings);
  info_.eos_token_ids = config.eos_token_ids;
  info_.drafters = model_.engine->drafter_names();
  info_.default_drafter = options_.default_drafter;
  info_.default_max_draft_tokens = options_.default_max_draft_tokens;
  info_.verify_defaults = options_.verify_defaults;
  info_.max_queue = options_.max_queue;
  info_.max_batch_size = options_.max_batch_size;
  info_.kv_cache_blocks = model_.target->kv_stats().num_blocks;
  if (metrics_) metrics_->DeclareDraftPositions(std::max(options_.default_max_draft_tokens, 1));
  PublishLoad();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Shutdown(); }

StatusOr<std::shared_ptr<RequestChannel>> EngineLoop::Submit(LoopRequest request) {
  // Everything here is a pure function of the request and fixed facts, so it is safe on the
  // caller's thread while the loop thread drives the engine.
  const SpecRequest& spec = request.spec;
  RETURN_IF_ERROR(ValidateRequest(model_.target->config(), spec.generation));
  const std::string& drafter = spec.speculation.drafter;
  if (!drafter.empty() && drafter != "none" &&
      std::find(info_.drafters.begin(), info_.drafters.end(), drafter) == info_.drafters.end()) {
    std::string known = "none";
    for (const std::string& d : info_.drafters) known += ", " + d;
    return InvalidArgumentError(StrCat("unknown drafter '", drafter, "' (available: ", known, ")"));
  }
  RETURN_IF_ERROR(spec.speculation.verify.Validate());
  for (size_t i = 0; i < request.stop_strings.size(); ++i) {
    if (request.stop_strings[i].empty()) {
      return InvalidArgumentError(StrCat("stop[", i, "] is empty"));
    }
  }
  auto channel = std::make_shared<RequestChannel>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !accepting_) return UnavailableError("the server is shutting down");
    if (in_flight_.load() >= options_.max_queue) {
      return ResourceExhaustedError(StrCat("the server's queue is full: ", options_.max_queue,
                                           " requests are waiting or running (max_queue)"));
    }
    in_flight_.fetch_add(1);
    inbox_.push_back({std::move(request), channel});
  }
  wake_.notify_one();
  return channel;
}

void EngineLoop::Cancel(RequestChannel& channel) {
  channel.RequestCancel();
  // Taking the lock orders the flag before the loop's next wait, so the wake-up is never lost.
  { std::lock_guard<std::mutex> lock(mu_); }
  wake_.notify_one();
}

void EngineLoop::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void EngineLoop::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

LoadSnapshot EngineLoop::load() const {
  LoadSnapshot s;
  s.running = running_.load();
  s.waiting = waiting_.load();
  s.in_flight = in_flight_.load();
  s.kv_cache_blocks_used = kv_blocks_used_.load();
  s.kv_cache_blocks_total = info_.kv_cache_blocks;
  return s;
}

void EngineLoop::Run() {
  while (true) {
    std::vector<Pending> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || model_.engine->HasWork(); });
      if (stopping_) {
        incoming.swap(inbox_);
        lock.unlock();
        const Status down = UnavailableError("the server is shutting down");
        for (Pending& p : incoming) {
          Active a(*model_.tokenizer, std::move(p.request), std::move(p.channel));
          Deliver(a, {.finish_reason = FinishReason::kCancelled, .status = down});
        }
        FailAll(down);
        PublishLoad();
        return;
      }
      incoming.swap(inbox_);
    }
    AdmitInbox(std::move(incoming));
    CheckCancellations();
    if (model_.engine->HasWork()) ProcessStep();
    PublishLoad();
  }
}

void EngineLoop::AdmitInbox(std::vector<Pending> incoming) {
  for (Pending& p : incoming) {
    auto a =
        std::make_unique<Active>(*model_.tokenizer, std::move(p.request), std::move(p.channel));
    a->stats.lossy =
        a->request.spec.speculation.enabled() && a->request.spec.speculation.verify.lossy();
    const int64_t prompt = static_cast<int64_t>(a->request.spec.generation.prompt.size());
    if (a->channel->cancel_requested()) {
      Deliver(*a, {.finish_reason = FinishReason::kCancelled,
                   .status = CancelledError("the request was cancelled")});
      continue;
    }
    auto id = model_.engine->Submit(a->request.spec);
    if (!id.ok()) {  // e.g. RESOURCE_EXHAUSTED: the request could never fit the KV cache
      Deliver(*a, {.finish_reason = FinishReason::kError, .status = id.status()});
      continue;
    }
    if (metrics_) metrics_->Admitted(prompt, a->stats.lossy);
    active_[*id] = std::move(a);
  }
}

void EngineLoop::CheckCancellations() {
  const Clock::time_point now = Clock::now();
  for (auto& [id, a] : active_) {
    if (a->cancelling || a->delivered) continue;
    if (a->channel->cancel_requested()) {
      a->cancel_status = CancelledError("the request was cancelled");
    } else if (now >= a->request.deadline) {
      a->cancel_status = DeadlineExceededError("the request's deadline passed");
    } else {
      continue;
    }
    a->cancelling = model_.engine->Cancel(id).ok();
  }
}

void EngineLoop::ProcessStep() {
  auto report = model_.engine->Step();
  if (!report.ok()) {
    FailAll(report.status().WithContext("engine step"));
    return;
  }
  PublishLoad();  // before any event, so a client that saw tokens sees their KV blocks in load()
  const Clock::time_point now = Clock::now();
  for (RequestUpdate& u : report->updates) {
    auto it = active_.find(u.id);
    if (it == active_.end()) continue;
    Active& a = *it->second;
    if (metrics_) metrics_->SpecProgress(a.stats, u.stats);
    a.stats = u.stats;
    if (a.delivered) {  // ended by a stop string; the engine has now dropped it too
      if (u.finished) active_.erase(it);
      continue;
    }

    LoopEvent event;
    for (int32_t token : u.new_tokens) {
      event.token_ids.push_back(token);
      // Ids the tokenizer does not know (a model vocabulary padded past the tokenizer's) have no
      // text.
      auto piece = a.decoder.Push(token);
      if (piece.ok()) event.text += a.stops.Push(*piece);
      if (a.stops.matched()) break;
    }
    if (!event.token_ids.empty()) {
      a.completion_tokens += static_cast<int64_t>(event.token_ids.size());
      if (metrics_) {
        metrics_->TokensDelivered(static_cast<int64_t>(event.token_ids.size()),
                                  !a.first_token_delivered, SecondsBetween(a.last_delivery, now));
      }
      a.first_token_delivered = true;
      a.last_delivery = now;
    }
    if (!a.stops.matched() && u.finished &&
        (u.finish_reason == "stop" || u.finish_reason == "length")) {
      event.text += a.stops.Push(a.decoder.Flush());
      if (!a.stops.matched()) event.text += a.stops.Flush();
    }

    if (a.stops.matched()) {
      event.finish_reason = FinishReason::kStopString;
      event.stop_string = a.stops.matched_stop();
      Deliver(a, std::move(event));
      if (u.finished) {
        active_.erase(it);
      } else if (!model_.engine->Cancel(u.id).ok()) {
        active_.erase(it);
      }
      continue;
    }
    if (!u.finished) {
      if (!event.token_ids.empty() || !event.text.empty()) a.channel->Push(std::move(event));
      continue;
    }
    if (u.finish_reason == "stop") {
      event.finish_reason = FinishReason::kStop;
    } else if (u.finish_reason == "length") {
      event.finish_reason = FinishReason::kLength;
    } else if (u.finish_reason == "cancelled") {
      event.finish_reason = FinishReason::kCancelled;
      event.status =
          a.cancel_status.ok() ? CancelledError("the request was cancelled") : a.cancel_status;
    } else {
      event.finish_reason = FinishReason::kError;
      event.status =
          u.error.ok()
              ? InternalError(StrCat("the engine ended the request with '", u.finish_reason, "'"))
              : u.error;
    }
    Deliver(a, std::move(event));
    active_.erase(it);
  }
}

void EngineLoop::Deliver(Active& a, LoopEvent event) {
  event.finished = true;
  event.prompt_tokens = static_cast<int64_t>(a.request.spec.generation.prompt.size());
  event.completion_tokens = a.completion_tokens;
  event.stats = a.stats;
  if (metrics_) {
    metrics_->Finished(event.finish_reason, SecondsBetween(a.request.arrival, Clock::now()));
  }
  a.delivered = true;
  a.channel->Push(std::move(event));
  in_flight_.fetch_sub(1);
}

void EngineLoop::FailAll(const Status& status) {
  const FinishReason reason =
      status.code() == StatusCode::kUnavailable ? FinishReason::kCancelled : FinishReason::kError;
  for (auto& [id, a] : active_) {
    if (!a->delivered) Deliver(*a, {.finish_reason = reason, .status = status});
    (void)model_.engine->Cancel(id);
  }
  active_.clear();
}

void EngineLoop::PublishLoad() {
  const SpecEngine& engine = *model_.engine;
  int32_t inbox = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox = static_cast<int32_t>(inbox_.size());
  }
  const KvCacheStats kv = model_.target->kv_stats();
  running_.store(engine.num_running());
  waiting_.store(engine.num_waiting() + inbox);
  kv_blocks_used_.store(kv.num_blocks - kv.free_blocks);
  if (metrics_) metrics_->SetLoad(running_.load(), waiting_.load(), kv.usage());
}

}  // namespace specula::router
