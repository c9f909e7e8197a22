// The progress lines of the trainers (LM, SpecFormer, Beagle). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

// "1h02m03s".
std::string FormatDuration(double seconds);

// "step i/N | <stage> | loss .. | lr .. | N tok/s | elapsed .. | ETA .." (no stage part when
// `stage` is empty); the ETA extrapolates this run's seconds per step.
std::string ProgressLine(int64_t done, int64_t total, std::string_view stage, double loss,
                         double lr, int64_t tokens_this_run, int64_t steps_this_run,
                         double elapsed_seconds);

// "0.123 0.456 ..." (3 decimals).
std::string FormatValues(const std::vector<double>& values);

}  // namespace specula
