#include "common/spec/step_trace.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>

namespace specula {

StatusOr<std::unique_ptr<StepTrace>> StepTrace::Open(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return InvalidArgumentError(
        StrCat("--step-trace: cannot create ", path, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<StepTrace>(new StepTrace(file));
}

StepTrace::~StepTrace() { std::fclose(file_); }

int64_t StepTrace::lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_;
}

void StepTrace::Write(const std::string& label, int64_t step, const TracedPlan* plan,
                      const StepReport& report, double wall_seconds) {
  // Milliseconds to the microsecond (the clocks' useful resolution), in the documented order.
  auto ms = [](double seconds) { return std::round(seconds * 1e6) / 1e3; };
  auto round = [](double x) { return std::round(x * 1e3) / 1e3; };
  const double since_open =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened_).count();
  nlohmann::ordered_json line = {{"label", label}, {"step", step}, {"t_ms", ms(since_open)}};
  if (plan != nullptr) {
    int64_t nodes = 0, drafting = 0;
    for (int32_t b : plan->decision.budgets) {
      nodes += b;
      drafting += b > 0 ? 1 : 0;
    }
    line["plan"] = {{"decoding", plan->base.decoding},
                    {"prefill_tokens", plan->base.chunks.tokens},
                    {"prefill_attention", plan->base.chunks.attention},
                    {"quiet", plan->quiet},
                    {"audit_off", plan->audit_off},
                    {"quiet_steps", plan->decision.quiet_steps},
                    {"nodes", nodes},
                    {"drafting", drafting},
                    {"explored", round(plan->decision.explored_nodes)},
                    {"ms", ms(plan->decision.predicted_seconds)},
                    {"tokens", round(plan->decision.predicted_tokens)},
                    {"no_draft_ms", ms(plan->decision.no_draft_seconds)},
                    {"no_draft_tokens", round(plan->decision.no_draft_tokens)}};
  }
  int64_t draft_nodes = 0, accepted = 0, new_tokens = 0;
  for (const RequestUpdate& u : report.updates) {
    draft_nodes += u.draft_nodes;
    accepted += u.draft_accepted;
    new_tokens += static_cast<int64_t>(u.new_tokens.size());
  }
  line["prefill_tokens"] = report.prefill_tokens;
  line["verify_tokens"] = report.verify_tokens;
  line["prefill_attention"] = report.prefill_attention;
  line["draft_nodes"] = draft_nodes;
  line["accepted"] = accepted;
  line["new_tokens"] = new_tokens;
  line["wall_ms"] = ms(wall_seconds);
  line["target_ms"] = ms(report.verify_seconds);
  line["forward_ms"] = ms(report.forward_seconds);
  line["draft_ms"] = ms(report.draft_seconds);
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  for (const DrafterCall& c : report.drafter_calls) {
    calls.push_back({{"drafter", c.drafter},
                     {"sequences", c.sequences},
                     {"nodes", c.nodes},
                     {"observed_tokens", c.observed_tokens},
                     {"ms", ms(c.seconds)}});
  }
  line["drafter_calls"] = std::move(calls);
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard<std::mutex> lock(mu_);
  std::fputs(text.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
  ++lines_;
}

}  // namespace specula
