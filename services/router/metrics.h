// The router's Prometheus metrics (names mirror vLLM V1's, prefixed specula_, each with a
// `model_name` label as vLLM's) and the HTTP endpoint that serves them. Renaming `specula_` to
// `vllm:` at ingestion (deploy/README.md) lets unmodified vLLM dashboards read them.
//
// Recording methods are called by the engine loop thread; scraping (Text(), the endpoint's HTTP
// thread) may happen concurrently (prometheus-cpp metrics are thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/step_contract.h"
#include "common/util/status.h"
#include "services/router/request_channel.h"

namespace specula::router {

// What the adaptive draft budget decided for one step and how the step went.
struct BudgetSnapshot {
  std::vector<int32_t> budgets;  // nodes given to each drafting-capable sequence
  double predicted_seconds = 0;  // the step as the policy predicted it
  double measured_seconds = 0;   // and as it ran (the router's wall time of the step)
  double predicted_speedup = 1;  // tokens/s at the budgets over tokens/s without drafts
  // The drafting audit (drafting_audit.h): drafting epochs' measured tokens/s over no-draft
  // epochs' (1 before the first pair), and its verdict: 1 pays, 0 does not, -1 none yet.
  double realized_speedup = 1;
  int32_t drafting_verdict = -1;
  double spare_tokens = 0;  // tokens the forward could add within 5% of its time
  // The streams' p99 gap without drafts and the steps' p99.9 overrun of their plans, over the last
  // planned steps (StepGapTail; 0 until measured): what --max-draft-slowdown bounds against.
  double gap_p99_seconds = 0;
  double overrun_p999_seconds = 0;
  double row_price = 0;    // BudgetDecision::min_reach: the reach a node needs to pay
  double kappa = 0;        // a * depth / k over recent drafting steps (SpecFormer)
  double theta = 0;        // kappa / speedup (lower is better)
  double draft_share = 0;  // drafters' share of recent step time
  // Per drafter: p[d] = P(depth d + 1 accepted | depth d accepted), d = 0..
  std::vector<std::pair<std::string, std::vector<double>>> acceptance;
  // Per drafter, P(node j + 1 comes back | node j did): budgets that came back short or empty.
  std::vector<std::pair<std::string, std::vector<double>>> supply;
  // Per drafter and streak (the sequence's last draft kept "full", "partial" or "rejected"): what
  // the streak adds to p[d] (AcceptanceModel::StreakShift), d = 0..
  struct StreakShift {
    std::string drafter, streak;
    std::vector<double> shift;
  };
  std::vector<StreakShift> streak_shift;
};

// One request as the router saw it end: what the per-request histograms, request_success and the
// access log (server_log.h) are made of. Seconds; the phases are vLLM's (queued = arrival to
// admission into the batch, prefill = admission to first token, decode = first to last token,
// inference = admission to last token).
struct FinishedRequest {
  std::string id;  // the client's request id, or the server's "req-N"
  FinishReason reason = FinishReason::kStop;
  Status status;                 // not OK when the request did not complete
  std::string drafter = "none";  // "none" without speculation
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t max_tokens = 0;  // the request's max_new_tokens
  bool admitted = false;   // reached the engine's batch; the phases below are set only then
  double queue_seconds = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  double inference_seconds = 0;
  double ttft_seconds = -1;  // arrival to first token; < 0: no token was delivered
  double e2e_seconds = 0;    // arrival to end
  SpecRequestStats stats;

  // Mean seconds per output token after the first (vLLM's request_time_per_output_token); < 0
  // with fewer than two tokens.
  double time_per_output_token() const {
    return completion_tokens > 1 ? decode_seconds / static_cast<double>(completion_tokens - 1) : -1;
  }
};

// vLLM's finished_reason for ours: stop, length, abort (cancelled, deadline, shutdown) or error;
// a stop string is vLLM's "stop". Our finer reason stays in the `specula_reason` label.
const char* VllmFinishReason(FinishReason reason);

// Running totals and current load, for the periodic stats log line.
struct RouterTotals {
  double prompt_tokens = 0;
  double generation_tokens = 0;
  double finished = 0;  // requests that ended, any reason
  double drafts = 0;
  double draft_tokens = 0;
  double accepted_tokens = 0;
  double running = 0;
  double waiting = 0;
  double kv_cache_usage = 0;  // 0..1
};

struct RouterMetricsOptions {
  std::string model_name;     // the `model_name` label of every metric ("" = no label)
  int64_t max_model_len = 0;  // the context length: top of the 1-2-5 token-count buckets
};

class RouterMetrics {
 public:
  explicit RouterMetrics(const RouterMetricsOptions& options = {});
  ~RouterMetrics();
  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // Serves GET /metrics on host:port (port 0 = any free port) until destruction. Returns the bound
  // port; UNAVAILABLE if it cannot bind. At most once.
  StatusOr<int> Expose(const std::string& host, int port);
  // Every metric in Prometheus text format, as /metrics returns it.
  std::string Text() const;

  // Lists the per-position acceptance counters of positions [0, n) at zero from the start.
  void DeclareDraftPositions(int n);
  // A request was refused before reaching the engine (bad field, queue full): counted by code.
  void Rejected(StatusCode code);
  // A request entered the engine with this many prompt tokens.
  void Admitted(int64_t prompt_tokens, bool lossy);
  // Tokens delivered to a request: the first delivery observes time to first token, later ones the
  // inter-token latency (one observation per engine step, as vLLM does with speculation).
  void TokensDelivered(int64_t tokens, bool first, double seconds_since_previous);
  // Speculation progress of one request between two engine reports (running totals).
  void SpecProgress(const SpecRequestStats& before, const SpecRequestStats& after);
  // A request ended (delivered its last event): request_success{finished_reason, specula_reason},
  // e2e, and vLLM's per-request histograms.
  void Finished(const FinishedRequest& request);
  void SetLoad(int64_t running, int64_t waiting, double kv_cache_usage);
  // One engine step: its wall time as the router saw it (transport included) and as the target
  // measured it; the difference is the cost of the path between them (0 in one process).
  void StepTimed(double router_seconds, double target_seconds);
  // Tokens one engine step processed for clients: prompt tokens prefilled plus tokens generated
  // (vLLM's iteration_tokens_total).
  void IterationTokens(int64_t tokens);
  void DraftBudget(const BudgetSnapshot& snapshot);

  // Thread-safe.
  RouterTotals Totals() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::router
