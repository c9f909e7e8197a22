#include "services/router/stop_strings.h"

#include <algorithm>

namespace specula::router {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of `stop`.
size_t PartialMatch(std::string_view text, std::string_view stop) {
  for (size_t n = std::min(text.size(), stop.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == stop.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopStringMatcher::Push(std::string_view text) {
  if (matched()) return "";
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest occurrence of any stop string wins (the shorter one on a tie).
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = held_.find(stops_[i]);
    if (pos == std::string::npos) continue;
    if (best == std::string::npos || pos < best ||
        (pos == best && stops_[i].size() < stops_[matched_].size())) {
      best = pos;
      matched_ = static_cast<int>(i);
    }
  }
  if (matched()) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  size_t keep = 0;
  for (const std::string& stop : stops_) keep = std::max(keep, PartialMatch(held_, stop));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

const std::string& StopStringMatcher::matched_stop() const {
  static const std::string kNone;
  return matched() ? stops_[matched_] : kNone;
}

}  // namespace specula::router
