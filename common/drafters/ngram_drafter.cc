#include "common/drafters/ngram_drafter.h"

#include <algorithm>
#include <span>

#include "common/drafters/draft_outcomes.h"

namespace specula {
namespace {

// Polynomial hash of a token window, modulo 2^64: prefix[i] = prefix[i - 1] * kBase + token + 1, so
// the hash of tokens [b, e) is prefix[e] - prefix[b] * kBase^(e - b) in O(1).
constexpr uint64_t kBase = 0x9E3779B97F4A7C15ull;  // odd, so multiplication is invertible

// splitmix64's finaliser: spreads the polynomial hash over the bucket index bits.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

bool ValidOptions(const NgramDrafterOptions& o) {
  return o.min_ngram >= 1 && o.min_ngram <= o.max_ngram && o.max_ngram <= NgramDrafter::kMaxNgram &&
         o.repeat_min_match >= 0;
}

}  // namespace

// One n-gram of the history, named by where it ends (exclusive); `hash` is its window hash. Keys
// compare by their real tokens, so hash collisions never produce a false match.
struct NgramKey {
  uint64_t hash = 0;
  int64_t end = 0;
};

struct NgramKeyHash {
  size_t operator()(const NgramKey& k) const { return static_cast<size_t>(k.hash); }
};

struct NgramKeyEq {
  const std::vector<int32_t>* tokens = nullptr;
  int32_t n = 0;
  bool operator()(const NgramKey& a, const NgramKey& b) const {
    if (a.hash != b.hash) return false;
    const int32_t* t = tokens->data();
    return std::equal(t + a.end - n, t + a.end, t + b.end - n);
  }
};

struct NgramDrafter::State {
  // index[k] maps an n-gram (n = min_ngram + k) to the latest position where it ended (exclusive),
  // among the n-grams that end before the last token; the first occurrence is the map key.
  using Index = std::unordered_map<NgramKey, int64_t, NgramKeyHash, NgramKeyEq>;

  State(int32_t min_n, int32_t max_n) : min_ngram(min_n), max_ngram(max_n) {
    prefix.push_back(0);
    for (int32_t n = 0; n <= std::max(max_n, 0); ++n) {
      power.push_back(n == 0 ? 1 : power.back() * kBase);
    }
    for (int32_t n = min_n; n <= max_n; ++n) {
      index.emplace_back(16, NgramKeyHash{}, NgramKeyEq{&tokens, n});
    }
  }
  State(const State&) = delete;  // the indexes point at `tokens`
  State& operator=(const State&) = delete;

  // Hash of tokens [end - n, end).
  uint64_t Hash(int64_t end, int32_t n) const {
    return Mix(prefix[end] - prefix[end - n] * power[n]);
  }

  void Append(int32_t token) {
    tokens.push_back(token);
    prefix.push_back(prefix.back() * kBase + static_cast<uint32_t>(token) + 1);
    // The n-grams ending just before the new token now end before the last position.
    const int64_t end = static_cast<int64_t>(tokens.size()) - 1;
    for (int32_t n = min_ngram; n <= max_ngram && n <= end; ++n) {
      auto [it, inserted] = index[n - min_ngram].try_emplace(NgramKey{Hash(end, n), end}, end);
      if (!inserted) it->second = end;
    }
  }

  // The tokens that followed the most recent earlier occurrence of the longest matching suffix.
  struct Draft {
    std::vector<int32_t> chain;
    int64_t match = 0;  // the match behind it, extended backwards up to `measure` tokens
  };
  // The draft: the tokens after the latest earlier occurrence of the longest matching suffix,
  // up to max_len. A continuation that reaches the last token is continued with its own period
  // (tokens [start, H) repeat) when the match has repeat_min_match tokens.
  Draft Continuation(int64_t max_len, int32_t repeat_min_match, int32_t measure) const {
    const int64_t H = static_cast<int64_t>(tokens.size());
    if (max_len <= 0) return {};
    for (int32_t n = max_ngram; n >= min_ngram; --n) {
      if (n > H - 1) continue;  // an earlier occurrence must end by position H - 1
      const Index& idx = index[n - min_ngram];
      auto it = idx.find(NgramKey{Hash(H, n), H});
      if (it == idx.end()) continue;
      const int64_t start = it->second;  // < H: at least one token follows
      Draft draft{.match = n};           // tokens [start - match, start) == [H - match, H)
      const int64_t longest = std::max(measure, repeat_min_match);
      while (draft.match < longest && start - draft.match - 1 >= 0 &&
             tokens[start - draft.match - 1] == tokens[H - draft.match - 1]) {
        ++draft.match;
      }
      const int64_t period = H - start;
      const bool repeat = repeat_min_match > 0 && draft.match >= repeat_min_match;
      const int64_t len = repeat ? max_len : std::min(max_len, period);
      draft.chain.resize(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) draft.chain[i] = tokens[start + i % period];
      return draft;
    }
    return {};
  }

  const int32_t min_ngram, max_ngram;
  bool sampled = false;    // which calibration its drafts count in
  DraftOutcomes outcomes;  // its proposals, compared with what followed them
  std::vector<int32_t> tokens;
  std::vector<uint64_t> prefix;  // [H + 1]
  std::vector<uint64_t> power;   // kBase^n for n in [0, max_ngram]
  std::vector<Index> index;      // one per n in [min_ngram, max_ngram]
};

StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(NgramDrafterOptions options) {
  if (options.min_ngram < 1) {
    return InvalidArgumentError(StrCat("min_ngram must be >= 1, got ", options.min_ngram));
  }
  if (options.max_ngram < options.min_ngram) {
    return InvalidArgumentError(StrCat("max_ngram (", options.max_ngram, ") must be >= min_ngram (",
                                       options.min_ngram, ")"));
  }
  if (options.max_ngram > kMaxNgram) {
    return InvalidArgumentError(
        StrCat("max_ngram must be <= ", kMaxNgram, ", got ", options.max_ngram));
  }
  if (options.repeat_min_match < 0) {
    return InvalidArgumentError(
        StrCat("repeat_min_match must be >= 0 (0 = never repeat), got ", options.repeat_min_match));
  }
  return std::make_unique<NgramDrafter>(options);
}

NgramDrafter::NgramDrafter(NgramDrafterOptions options)
    : options_(ValidOptions(options) ? options : NgramDrafterOptions{1, 0, options.vocab_size}) {}

NgramDrafter::~NgramDrafter() = default;

Status NgramDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  if (states_.count(seq)) return AlreadyExistsError(StrCat("sequence ", seq, " was already added"));
  auto state = std::make_unique<State>(options_.min_ngram, options_.max_ngram);
  state->sampled = sampling.temperature > 0;
  states_.emplace(seq, std::move(state));
  return OkStatus();
}

void NgramDrafter::ReleaseSequence(SeqId seq) { states_.erase(seq); }

Status NgramDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  RETURN_IF_ERROR(CheckTokenObservations(observations, options_.vocab_size,
                                         [&](SeqId seq) { return states_.count(seq) > 0; }));
  for (const auto& o : observations) {
    State& st = *states_.at(o.seq);
    NgramCalibration& calibration = calibration_[st.sampled];
    const DraftOutcomes::Record record = [&](int32_t cls, int32_t j, bool accepted) {
      calibration.Record(cls, j, accepted);
    };
    for (int32_t t : o.tokens) {
      st.outcomes.Committed(static_cast<int64_t>(st.tokens.size()), t, record);
      st.Append(t);
    }
  }
  return OkStatus();
}

StatusOr<std::vector<CandidateTree>> NgramDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  RETURN_IF_ERROR(CheckDraftRequests(requests, [&](SeqId seq) { return states_.count(seq) > 0; }));
  std::vector<CandidateTree> trees;
  trees.reserve(requests.size());
  for (const auto& r : requests) {
    State& st = *states_.at(r.seq);
    const int32_t len = std::max(std::min(r.max_nodes, r.max_depth), 0);
    if (len == 0) {
      trees.push_back(CandidateTree());
      continue;
    }
    // The continuation as far as the calibration measures it (what was proposed is a prefix).
    State::Draft draft = st.Continuation(std::max(len, NgramCalibration::kDepth),
                                         options_.repeat_min_match, NgramCalibration::kLongMatch);
    if (draft.chain.empty()) {
      trees.push_back(CandidateTree());
      continue;
    }
    const int32_t cls = NgramCalibration::ClassOf(draft.match);
    int32_t keep = std::min(len, static_cast<int32_t>(draft.chain.size()));
    keep = calibration_[st.sampled].Keep(cls, keep, r.min_reach);
    trees.push_back(CandidateTree::Chain(std::span<const int32_t>(draft.chain).first(keep)));
    st.outcomes.Proposed(static_cast<int64_t>(st.tokens.size()), std::move(draft.chain), {cls});
  }
  return trees;
}

}  // namespace specula
