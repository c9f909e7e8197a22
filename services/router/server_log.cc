#include "services/router/server_log.h"

#include <cstdio>

#include "common/util/log.h"

namespace specula::router {
namespace {

// `value` as is when it is a plain token, else in double quotes with \", \\ and \xNN escapes.
std::string LogValue(std::string_view value) {
  bool plain = !value.empty();
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= ' ' || u == '"' || u == '\\' || u == 0x7f) plain = false;
  }
  if (plain) return std::string(value);
  std::string out = "\"";
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < ' ' || u == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Fixed(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Millis(double seconds) { return Fixed(seconds * 1e3, 1); }

}  // namespace

std::string AccessLogLine(const FinishedRequest& r) {
  std::string line =
      StrCat("request id=", LogValue(r.id), " status=", StatusCodeName(r.status.code()),
             " finish=", FinishReasonName(r.reason), " prompt_tokens=", r.prompt_tokens,
             " completion_tokens=", r.completion_tokens);
  line += " ttft_ms=" + (r.ttft_seconds >= 0 ? Millis(r.ttft_seconds) : std::string("-"));
  line += " e2e_ms=" + Millis(r.e2e_seconds);
  line += " queue_ms=" + Millis(r.queue_seconds);
  const double tpot = r.time_per_output_token();
  line += " tpot_ms=" + (tpot >= 0 ? Millis(tpot) : std::string("-"));
  line += " drafter=" + LogValue(r.drafter);
  line += " mean_accepted_len=" +
          (r.stats.steps > 0 ? Fixed(r.stats.mean_accepted_len(), 2) : std::string("-"));
  if (r.stats.lossy) line += " lossy=true";
  if (r.stats.draft_errors > 0) line += StrCat(" draft_errors=", r.stats.draft_errors);
  if (!r.status.ok()) line += " error=" + LogValue(r.status.message());
  return line;
}

std::string StatsLogLine(const RouterTotals& before, const RouterTotals& now, double seconds) {
  const double s = seconds > 0 ? seconds : 1;
  const double drafts = now.drafts - before.drafts;
  const double drafted = now.draft_tokens - before.draft_tokens;
  const double accepted = now.accepted_tokens - before.accepted_tokens;
  std::string line = StrCat(
      "stats: prompt ", Fixed((now.prompt_tokens - before.prompt_tokens) / s, 1),
      " tok/s, generation ", Fixed((now.generation_tokens - before.generation_tokens) / s, 1),
      " tok/s, finished ", Fixed(now.finished - before.finished, 0), ", running ",
      Fixed(now.running, 0), ", waiting ", Fixed(now.waiting, 0), ", KV cache ",
      Fixed(now.kv_cache_usage * 100, 1), "%");
  line += ", drafts " + Fixed(drafts, 0);
  if (drafts > 0 && drafted > 0) {
    line += ", draft acceptance " + Fixed(100 * accepted / drafted, 1) + "%";
    line += ", mean acceptance length " + Fixed(1 + accepted / drafts, 2);
  }
  return line;
}

StatsLogger::StatsLogger(const RouterMetrics* metrics, std::chrono::milliseconds period)
    : metrics_(metrics), period_(period), thread_([this] { Run(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void StatsLogger::Run() {
  using Clock = std::chrono::steady_clock;
  RouterTotals last = metrics_->Totals();
  Clock::time_point last_time = Clock::now();
  bool was_busy = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period_, [this] { return stopping_; })) {
    const RouterTotals now = metrics_->Totals();
    const Clock::time_point now_time = Clock::now();
    // Busy: tokens moved this period or requests are in the server. An idle server logs one more
    // line at INFO (the period that ended the work), then only at DEBUG.
    const bool busy = now.prompt_tokens != last.prompt_tokens ||
                      now.generation_tokens != last.generation_tokens || now.running > 0 ||
                      now.waiting > 0;
    const LogLevel level = busy || was_busy ? LogLevel::kInfo : LogLevel::kDebug;
    if (LogEnabled(level)) {
      Log(level,
          StatsLogLine(last, now, std::chrono::duration<double>(now_time - last_time).count()));
    }
    was_busy = busy;
    last = now;
    last_time = now_time;
  }
}

}  // namespace specula::router
