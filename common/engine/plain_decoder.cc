#include "common/engine/plain_decoder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <span>

namespace specula {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

Status ValidateRequest(const ModelConfig& config, const GenerationRequest& r) {
  return ValidateGenerationRequest(r, config.vocab_size, config.max_position_embeddings);
}

StatusOr<std::vector<GenerationResult>> DecodeBatch(ModelRunner& runner,
                                                    const std::vector<GenerationRequest>& requests,
                                                    const TokenCallback& on_token,
                                                    DecodeStats* stats) {
  for (size_t i = 0; i < requests.size(); ++i) {
    Status s = ValidateRequest(runner.config(), requests[i]);
    if (!s.ok()) return s.WithContext(StrCat("request ", i));
  }
  const size_t n = requests.size();
  std::vector<GenerationResult> results(n);
  std::vector<SeqId> ids(n);
  std::vector<SequenceRng> rngs;
  std::vector<bool> running(n, true);
  for (size_t i = 0; i < n; ++i) {
    ids[i] = NewSequenceId();
    rngs.emplace_back(requests[i].sampling.seed);
  }
  auto release_all = [&] {
    for (size_t i = 0; i < n; ++i) {
      if (runner.HasSequence(ids[i])) (void)runner.ReleaseSequence(ids[i]);
    }
  };
  DecodeStats local;
  DecodeStats& st = stats ? *stats : local;
  st = DecodeStats{};

  // Samples each sequence's next token from its logits row and retires finished sequences.
  auto consume = [&](const ForwardOutput& out, const std::vector<size_t>& members) {
    at::Tensor logits = out.logits.to(at::kCPU).contiguous();
    const int64_t V = logits.size(1);
    for (size_t b = 0; b < members.size(); ++b) {
      const size_t i = members[b];
      std::span<const float> row(logits.data_ptr<float>() + out.logits_offset[b] * V, V);
      const int32_t token = SampleToken(row, requests[i].sampling, rngs[i]);
      results[i].tokens.push_back(token);
      ++st.generated_tokens;
      if (on_token) on_token(i, token);
      const auto& stops = requests[i].stop_token_ids;
      if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
        results[i].finish_reason = FinishReason::kStop;
        running[i] = false;
      } else if (static_cast<int64_t>(results[i].tokens.size()) >= requests[i].max_new_tokens) {
        results[i].finish_reason = FinishReason::kLength;
        running[i] = false;
      }
    }
  };

  auto t0 = Clock::now();
  ForwardBatch prefill;
  std::vector<size_t> members;
  for (size_t i = 0; i < n; ++i) {
    Status s = runner.AddSequence(ids[i]);
    if (!s.ok()) {
      release_all();
      return s;
    }
    prefill.seqs.push_back({.seq = ids[i], .tokens = requests[i].prompt});
    members.push_back(i);
  }
  if (n == 0) return results;
  auto out = runner.Forward(prefill);
  if (!out.ok()) {
    release_all();
    return out.status();
  }
  consume(*out, members);
  st.prefill_seconds = SecondsSince(t0);

  auto t1 = Clock::now();
  while (true) {
    ForwardBatch step;
    members.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!running[i]) continue;
      step.seqs.push_back({.seq = ids[i], .tokens = {results[i].tokens.back()}});
      members.push_back(i);
    }
    if (members.empty()) break;
    auto step_out = runner.Forward(step);
    if (!step_out.ok()) {
      release_all();
      return step_out.status();
    }
    ++st.forward_steps;
    consume(*step_out, members);
  }
  st.decode_seconds = SecondsSince(t1);
  release_all();
  return results;
}

}  // namespace specula
