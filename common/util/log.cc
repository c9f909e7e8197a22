#include "common/util/log.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace specula {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mu;
std::function<void(std::string_view)>* g_sink = nullptr;  // guarded by g_mu; null = stderr

}  // namespace

StatusOr<LogLevel> ParseLogLevel(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning" || name == "warn") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  return InvalidArgumentError(
      StrCat("log level must be debug, info, warning, error or off, got '", name, "'"));
}

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      break;
  }
  return "OFF";
}

void SetLogLevel(LogLevel level) { g_level.store(level); }
LogLevel GetLogLevel() { return g_level.load(); }

std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          std::string_view message) {
  const auto since_epoch = time.time_since_epoch();
  const std::time_t seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[64];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, millis);
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  std::string_view name = LogLevelName(level);
  std::string line = StrCat(stamp, " ", name);
  line.append(6 - std::min<size_t>(name.size(), 5), ' ');  // messages start in one column
  line.append(message);
  line.push_back('\n');
  return line;
}

void Log(LogLevel level, std::string_view message) {
  if (!LogEnabled(level)) return;
  const std::string line = FormatLogLine(std::chrono::system_clock::now(), level, message);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_sink) {
    (*g_sink)(line);
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void SetLogSink(std::function<void(std::string_view line)> sink) {
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_sink;
  g_sink = sink ? new std::function<void(std::string_view)>(std::move(sink)) : nullptr;
}

}  // namespace specula
