// What a load-generator run measured, summarized the way `vllm bench serve` reports it: request and
// token throughput, goodput under latency SLOs, and TTFT / TPOT / ITL / E2E latency mean, median,
// p99 (milliseconds). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::loadgen {

// One request as the client saw it.
struct RequestRecord {
  bool ok = false;
  std::string error;  // gRPC status when !ok
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double ttft_s = 0;          // send -> first token
  double e2e_s = 0;           // send -> last message
  std::vector<double> itl_s;  // gaps between consecutive token deliveries
  int64_t draft_tokens = 0;   // the server's speculation stats
  int64_t accepted_tokens = 0;
  int64_t spec_steps = 0;
};

struct Slo {
  double ttft_ms = 0;  // 0 = no bound
  double tpot_ms = 0;
  double e2el_ms = 0;
};

// vllm-bench-serve-shaped JSON: completed, failed, duration, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput, total_token_throughput,
// request_goodput, {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms, plus speculation totals
// (draft_tokens, accepted_tokens, mean_accepted_len).
nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const Slo& slo);

// p in [0, 100]; linear interpolation between order statistics (numpy's default). 0 if empty.
double Percentile(std::vector<double> values, double p);

}  // namespace specula::loadgen
