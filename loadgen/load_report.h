// What a load-generator run measured, as the flat result object `vllm bench serve` writes:
// completed, failed, duration, total_input_tokens, total_output_tokens, request_throughput,
// request_goodput (null without SLOs), output_throughput, total_token_throughput,
// {mean,median,std}_{ttft,tpot,itl,e2el}_ms, p{P}_{metric}_ms for the chosen percentiles and
// metrics, and the per-request lists input_lens, output_lens, ttfts (s), itls (s), generated_texts,
// errors ("" when the request succeeded, else "CODE: message"); plus finish_reasons ("" for failed
// requests), Specula's speculation totals, and token_itl (below) with its list itl_tokens.
//
// ITL, as vLLM counts it, is one gap per streamed chunk. A speculative step streams all the tokens
// it accepted in one chunk, so the same stalls (a neighbour's prompt prefill) become a larger
// share of fewer gaps and the high percentiles rise although no step got longer. token_itl counts
// per token instead: a chunk of n tokens after a gap g contributes n gaps of g / n (what SGLang's
// bench_serving does with a request's mean accepted length, here exact per chunk). The run's
// settings (date, backend, model_id, ...) are added by the caller. Torch-free and gRPC-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/util/status.h"

namespace specula::loadgen {

// One request as the client saw it.
struct RequestRecord {
  bool ok = false;
  std::string error;        // gRPC status when !ok: "CODE: message"
  int32_t status_code = 0;  // the gRPC status code (0 = OK)
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  double ttft_s = 0;          // send -> first token
  double e2e_s = 0;           // send -> last message
  std::vector<double> itl_s;  // gaps between consecutive token deliveries
  // Tokens each of those deliveries brought (itl_tokens[i] after gap itl_s[i]); empty = one each.
  std::vector<int32_t> itl_tokens;
  std::string text;  // the generated text (concatenated deltas)
  // "stop", "length", "stop_string", ... from the stream's GenerationFinished; "" without one.
  std::string finish_reason;
  // The server's speculation stats (SpecStats of the last stream message).
  int64_t spec_steps = 0;
  int64_t draft_steps = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t draft_errors = 0;
  std::vector<int64_t> accepted_per_position;  // [d]: accepted at depth d + 1
  bool lossy = false;
};

// The latency metrics that may get percentiles, in vLLM's names.
inline const std::vector<std::string>& LatencyMetrics() {
  static const std::vector<std::string> kMetrics = {"ttft", "tpot", "itl", "token_itl", "e2el"};
  return kMetrics;
}

struct ReportOptions {
  std::vector<double> percentiles = {99};                                 // --metric-percentiles
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};  // --percentile-metrics
  // --goodput SLOs in ms by metric ("ttft", "tpot", "e2el"); empty = request_goodput is null.
  std::map<std::string, double> goodput;
};

// "25,50,99.9" -> {25, 50, 99.9}; INVALID_ARGUMENT naming --metric-percentiles for values
// outside [0, 100] or non-numbers.
StatusOr<std::vector<double>> ParseMetricPercentiles(const std::string& text);
// "ttft,tpot,itl" -> the names (LatencyMetrics()); INVALID_ARGUMENT naming --percentile-metrics for
// unknown ones.
StatusOr<std::vector<std::string>> ParsePercentileMetrics(const std::string& text);
// vLLM's --goodput syntax: {"ttft:200", "tpot:50"} -> {ttft: 200, tpot: 50} (ms). Keys ttft, tpot,
// e2el; values non-negative. INVALID_ARGUMENT naming the bad pair.
StatusOr<std::map<std::string, double>> ParseGoodput(const std::vector<std::string>& pairs);

// The key word of a percentile as vLLM writes it: 99 -> "99", 99.9 -> "99.9".
std::string PercentileWord(double p);

// The flat result object (see above) of one run's records (in request order).
nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const ReportOptions& options);

// p in [0, 100]; linear interpolation between order statistics (numpy's default). 0 if empty.
double Percentile(std::vector<double> values, double p);

}  // namespace specula::loadgen
