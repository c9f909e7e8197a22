#include "loadgen/load_report.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specula::loadgen {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

namespace {

void AddStats(nlohmann::json& out, const std::string& name, const std::vector<double>& ms) {
  double mean = 0, var = 0;
  if (!ms.empty()) {
    mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
    for (double v : ms) var += (v - mean) * (v - mean);
    var /= static_cast<double>(ms.size());
  }
  out["mean_" + name + "_ms"] = mean;
  out["median_" + name + "_ms"] = Percentile(ms, 50);
  out["std_" + name + "_ms"] = std::sqrt(var);
  out["p99_" + name + "_ms"] = Percentile(ms, 99);
}

}  // namespace

nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const Slo& slo) {
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t completed = 0, failed = 0, input = 0, output = 0, good = 0;
  int64_t draft = 0, accepted = 0, steps = 0;
  nlohmann::json errors = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++failed;
      if (errors.size() < 5) errors.push_back(r.error);
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.output_tokens;
    draft += r.draft_tokens;
    accepted += r.accepted_tokens;
    steps += r.spec_steps;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2e_s * 1e3);
    // vLLM: TPOT excludes the first token; requests with one output token have none.
    double request_tpot = 0;
    if (r.output_tokens > 1) {
      request_tpot = (r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1);
      tpot.push_back(request_tpot);
    }
    for (double gap : r.itl_s) itl.push_back(gap * 1e3);
    const bool meets = (slo.ttft_ms <= 0 || r.ttft_s * 1e3 <= slo.ttft_ms) &&
                       (slo.tpot_ms <= 0 || request_tpot <= slo.tpot_ms) &&
                       (slo.e2el_ms <= 0 || r.e2e_s * 1e3 <= slo.e2el_ms);
    good += meets;
  }
  nlohmann::json out;
  out["completed"] = completed;
  out["failed"] = failed;
  if (!errors.empty()) out["errors"] = errors;
  out["duration"] = duration_s;
  out["total_input_tokens"] = input;
  out["total_output_tokens"] = output;
  const double d = duration_s > 0 ? duration_s : 1;
  out["request_throughput"] = static_cast<double>(completed) / d;
  out["request_goodput"] = static_cast<double>(good) / d;
  out["output_throughput"] = static_cast<double>(output) / d;
  out["total_token_throughput"] = static_cast<double>(input + output) / d;
  AddStats(out, "ttft", ttft);
  AddStats(out, "tpot", tpot);
  AddStats(out, "itl", itl);
  AddStats(out, "e2el", e2el);
  out["draft_tokens"] = draft;
  out["accepted_tokens"] = accepted;
  out["mean_accepted_len"] =
      steps > 0 ? static_cast<double>(accepted + steps) / static_cast<double>(steps) : 0.0;
  return out;
}

}  // namespace specula::loadgen
