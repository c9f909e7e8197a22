// Server logs: one line per message on stderr, "2026-11-24T05:04:26.123Z INFO  message", with a
// process-wide level below which messages are dropped.
//
//   SetLogLevel(LogLevel::kWarning);                       // --log-level warning
//   if (LogEnabled(LogLevel::kDebug)) Log(LogLevel::kDebug, StrCat(...));  // skip costly text
//   LogInfo(StrCat("request ", id, " finished"));
//
// Torch-free and gRPC-free (common/ rule), so tools and services share it. Thread-safe: each line
// is written with one call under a mutex, so lines from different threads never interleave.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "common/util/status.h"

namespace specula {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

// "debug", "info", "warning", "error", "off"; INVALID_ARGUMENT names the accepted values.
StatusOr<LogLevel> ParseLogLevel(std::string_view name);
std::string_view LogLevelName(LogLevel level);  // "DEBUG", "INFO", "WARN", "ERROR", "OFF"

// The process-wide level (default kInfo).
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
inline bool LogEnabled(LogLevel level) { return level >= GetLogLevel() && level != LogLevel::kOff; }

// One line: the UTC timestamp with milliseconds, the level, the message (a trailing newline in
// `message` is not doubled).
std::string FormatLogLine(std::chrono::system_clock::time_point time, LogLevel level,
                          std::string_view message);

// Writes the line to the sink (stderr unless replaced) when `level` is enabled.
void Log(LogLevel level, std::string_view message);
inline void LogDebug(std::string_view message) { Log(LogLevel::kDebug, message); }
inline void LogInfo(std::string_view message) { Log(LogLevel::kInfo, message); }
inline void LogWarning(std::string_view message) { Log(LogLevel::kWarning, message); }
inline void LogError(std::string_view message) { Log(LogLevel::kError, message); }

// Replaces where complete lines go (tests); an empty function restores stderr. Not to be called
// while other threads log.
void SetLogSink(std::function<void(std::string_view line)> sink);

}  // namespace specula
