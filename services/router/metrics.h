// The router's Prometheus metrics (names mirror vLLM's, prefixed specula_) and the HTTP endpoint
// that serves them.
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
  double spare_tokens = 0;       // tokens the forward could add within 5% of its time
  double kappa = 0;              // a * depth / k over recent drafting steps (SpecFormer)
  double theta = 0;              // kappa / speedup (lower is better)
  double draft_share = 0;        // drafters' share of recent step time
  // Per drafter: p[d] = P(depth d + 1 accepted | depth d accepted), d = 0..
  std::vector<std::pair<std::string, std::vector<double>>> acceptance;
};

class RouterMetrics {
 public:
  RouterMetrics();
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
  void Finished(FinishReason reason, double e2e_seconds);
  void SetLoad(int64_t running, int64_t waiting, double kv_cache_usage);
  // One engine step: its wall time as the router saw it (transport included) and as the target
  // measured it; the difference is the cost of the path between them (0 in one process).
  void StepTimed(double router_seconds, double target_seconds);
  void DraftBudget(const BudgetSnapshot& snapshot);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::router
