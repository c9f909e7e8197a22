#include "loadgen/load_report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>
#include <sstream>

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

std::vector<std::string> SplitOn(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    const size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    out.push_back(item.substr(b, item.find_last_not_of(' ') - b + 1));
  }
  return out;
}

bool ParseNumber(const std::string& s, double* out) {
  try {
    size_t used = 0;
    *out = std::stod(s, &used);
    return used == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

void AddStats(nlohmann::json& out, const std::string& name, const std::vector<double>& ms,
              const ReportOptions& options) {
  double mean = 0, var = 0;
  if (!ms.empty()) {
    mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
    for (double v : ms) var += (v - mean) * (v - mean);
    var /= static_cast<double>(ms.size());
  }
  out["mean_" + name + "_ms"] = mean;
  out["median_" + name + "_ms"] = Percentile(ms, 50);
  out["std_" + name + "_ms"] = std::sqrt(var);
  const auto& chosen = options.percentile_metrics;
  if (std::find(chosen.begin(), chosen.end(), name) == chosen.end()) return;
  for (double p : options.percentiles) {
    out[StrCat("p", PercentileWord(p), "_", name, "_ms")] = Percentile(ms, p);
  }
}

}  // namespace

StatusOr<std::vector<double>> ParseMetricPercentiles(const std::string& text) {
  std::vector<double> out;
  for (const std::string& item : SplitOn(text, ',')) {
    double p = 0;
    if (!ParseNumber(item, &p) || !(p >= 0 && p <= 100)) {
      return InvalidArgumentError(
          StrCat("--metric-percentiles: '", item, "' is not a percentile in [0, 100]"));
    }
    out.push_back(p);
  }
  if (out.empty()) return InvalidArgumentError("--metric-percentiles is empty");
  return out;
}

StatusOr<std::vector<std::string>> ParsePercentileMetrics(const std::string& text) {
  std::vector<std::string> out = SplitOn(text, ',');
  for (const std::string& m : out) {
    const auto& known = LatencyMetrics();
    if (std::find(known.begin(), known.end(), m) == known.end()) {
      return InvalidArgumentError(StrCat("--percentile-metrics: unknown metric '", m,
                                         "' (ttft, tpot, itl, token_itl, e2el)"));
    }
  }
  if (out.empty()) return InvalidArgumentError("--percentile-metrics is empty");
  return out;
}

StatusOr<std::map<std::string, double>> ParseGoodput(const std::vector<std::string>& pairs) {
  std::map<std::string, double> out;
  for (const std::string& pair : pairs) {
    const size_t colon = pair.find(':');
    double v = 0;
    if (colon == std::string::npos || !ParseNumber(pair.substr(colon + 1), &v)) {
      return InvalidArgumentError(
          StrCat("--goodput: '", pair, "' is not KEY:VALUE (e.g. ttft:200, value in ms)"));
    }
    const std::string key = pair.substr(0, colon);
    if (key != "ttft" && key != "tpot" && key != "e2el") {
      return InvalidArgumentError(
          StrCat("--goodput: unknown metric '", key, "' (ttft, tpot or e2el)"));
    }
    if (v < 0) return InvalidArgumentError(StrCat("--goodput: '", pair, "' is negative"));
    out[key] = v;
  }
  return out;
}

std::string PercentileWord(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<int64_t>(p));
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof(buf), p);
  return std::string(buf, res.ptr);
}

nlohmann::json Summarize(const std::vector<RequestRecord>& records, double duration_s,
                         const ReportOptions& options) {
  std::vector<double> ttft, tpot, itl, token_itl, e2el;
  int64_t completed = 0, failed = 0, input = 0, output = 0, good = 0;
  int64_t steps = 0, draft_steps = 0, draft = 0, accepted = 0, draft_errors = 0, lossy = 0;
  std::vector<int64_t> per_position;
  nlohmann::json input_lens = nlohmann::json::array(), output_lens = nlohmann::json::array(),
                 ttfts = nlohmann::json::array(), itls = nlohmann::json::array(),
                 itl_tokens = nlohmann::json::array(), texts = nlohmann::json::array(),
                 errors = nlohmann::json::array(), finish_reasons = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    input_lens.push_back(r.prompt_tokens);
    output_lens.push_back(r.ok ? r.output_tokens : 0);
    ttfts.push_back(r.ok ? r.ttft_s : 0.0);
    itls.push_back(r.ok ? r.itl_s : std::vector<double>{});
    itl_tokens.push_back(r.ok ? r.itl_tokens : std::vector<int32_t>{});
    texts.push_back(r.text);
    errors.push_back(r.ok ? std::string() : r.error);
    finish_reasons.push_back(r.ok ? r.finish_reason : std::string());
    if (!r.ok) {
      ++failed;
      continue;
    }
    ++completed;
    input += r.prompt_tokens;
    output += r.output_tokens;
    steps += r.spec_steps;
    draft_steps += r.draft_steps;
    draft += r.draft_tokens;
    accepted += r.accepted_tokens;
    draft_errors += r.draft_errors;
    lossy += r.lossy;
    if (per_position.size() < r.accepted_per_position.size()) {
      per_position.resize(r.accepted_per_position.size(), 0);
    }
    for (size_t d = 0; d < r.accepted_per_position.size(); ++d) {
      per_position[d] += r.accepted_per_position[d];
    }
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.e2e_s * 1e3);
    // vLLM: TPOT excludes the first token; requests with one output token have none (and count
    // as 0 against a TPOT SLO).
    double request_tpot = 0;
    if (r.output_tokens > 1) {
      request_tpot = (r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1);
      tpot.push_back(request_tpot);
    }
    for (size_t i = 0; i < r.itl_s.size(); ++i) {
      const double gap_ms = r.itl_s[i] * 1e3;
      itl.push_back(gap_ms);
      const int32_t n = i < r.itl_tokens.size() ? std::max<int32_t>(r.itl_tokens[i], 1) : 1;
      token_itl.insert(token_itl.end(), n, gap_ms / n);
    }
    bool meets = true;
    for (const auto& [metric, bound] : options.goodput) {
      const double v = metric == "ttft"   ? r.ttft_s * 1e3
                       : metric == "tpot" ? request_tpot
                                          : r.e2e_s * 1e3;
      meets = meets && v <= bound;
    }
    good += meets;
  }
  nlohmann::json out;
  out["duration"] = duration_s;
  out["completed"] = completed;
  out["failed"] = failed;
  out["total_input_tokens"] = input;
  out["total_output_tokens"] = output;
  const double d = duration_s > 0 ? duration_s : 1;
  out["request_throughput"] = static_cast<double>(completed) / d;
  out["request_goodput"] =
      options.goodput.empty() ? nlohmann::json(nullptr) : nlohmann::json(good / d);
  out["output_throughput"] = static_cast<double>(output) / d;
  out["total_token_throughput"] = static_cast<double>(input + output) / d;
  out["input_lens"] = std::move(input_lens);
  out["output_lens"] = std::move(output_lens);
  out["ttfts"] = std::move(ttfts);
  out["itls"] = std::move(itls);
  out["itl_tokens"] = std::move(itl_tokens);
  out["generated_texts"] = std::move(texts);
  out["errors"] = std::move(errors);
  out["finish_reasons"] = std::move(finish_reasons);
  AddStats(out, "ttft", ttft, options);
  AddStats(out, "tpot", tpot, options);
  AddStats(out, "itl", itl, options);
  AddStats(out, "token_itl", token_itl, options);
  AddStats(out, "e2el", e2el, options);
  // Speculation (Specula): vLLM's spec-decode counters, summed over completed requests.
  out["num_drafts"] = draft_steps;
  out["draft_tokens"] = draft;
  out["accepted_tokens"] = accepted;
  out["acceptance_rate"] = draft > 0 ? static_cast<double>(accepted) / draft : 0.0;
  out["mean_accepted_len"] =
      steps > 0 ? static_cast<double>(accepted + steps) / static_cast<double>(steps) : 0.0;
  out["accepted_per_position"] = per_position;
  std::vector<double> rate_per_position;
  for (int64_t a : per_position) {
    rate_per_position.push_back(draft_steps > 0 ? static_cast<double>(a) / draft_steps : 0.0);
  }
  out["acceptance_rate_per_position"] = rate_per_position;
  out["draft_errors"] = draft_errors;
  out["lossy_requests"] = lossy;
  return out;
}

}  // namespace specula::loadgen
