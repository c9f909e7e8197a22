// A tqdm-style progress line on a terminal stream: "label  45%|#####     | 29/64 [00:03<00:04,
// 8.2 req/s]", redrawn in place at most ten times a second and once more when done. Add() is
// thread-safe (client threads call it as requests finish).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace specula::loadgen {

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, std::string label, int64_t total);
  ~ProgressBar();  // Finish()
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Add(int64_t n = 1);
  // Draws the final state and ends the line (idempotent).
  void Finish();

  // Whether to draw bars: never with --disable-tqdm, always with --progress, otherwise only when
  // stderr is a terminal.
  static bool Enabled(bool disable, bool force);

  // The line for `done` of `total` after `elapsed_s` (no carriage return), for tests.
  static std::string Render(const std::string& label, int64_t done, int64_t total,
                            double elapsed_s);

 private:
  void Draw(bool final);

  std::FILE* out_;
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace specula::loadgen
