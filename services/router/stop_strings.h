// Stop strings on a stream of detokenized text.
//
// Text is pushed chunk by chunk as tokens are decoded. Push() returns the text that is safe to
// send: everything before the earliest stop string once one has appeared, and otherwise
// everything except a tail that could still turn out to be the start of a stop string (held back
// until later text settles it). Chunks are assumed to be whole UTF-8 characters, as StreamDecoder
// produces them; held-back tails then start at a character boundary too.
//
// Not thread-safe: one matcher per request.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace specula::router {

class StopStringMatcher {
 public:
  // `stops` must not contain empty strings (callers validate); no stops = pass-through.
  explicit StopStringMatcher(std::vector<std::string> stops = {});

  // The text that can be sent now. After a match, returns "" for every later call.
  std::string Push(std::string_view text);
  // The held-back tail (call once the stream has ended without a match).
  std::string Flush();

  bool matched() const { return matched_ >= 0; }
  // The stop string that matched ("" if none).
  const std::string& matched_stop() const;

 private:
  std::vector<std::string> stops_;
  std::string held_;
  int matched_ = -1;
};

}  // namespace specula::router
