#include "common/drafters/drafter_warm_up.h"

#include <torch/torch.h>

#include <limits>
#include <vector>

#include "common/model/transformer.h"  // ParseTorchDtype

namespace specula {
namespace {

// Not a sequence id the engine hands out (it counts up from 1).
constexpr SeqId kWarmUpSeq = std::numeric_limits<SeqId>::max();

DrafterObservation Observation(const Drafter& drafter, int32_t first_token, int64_t tokens,
                               int64_t rows, int32_t vocab_size, int64_t hidden_size,
                               const at::TensorOptions& options) {
  DrafterObservation o{.seq = kWarmUpSeq};
  for (int64_t i = 0; i < tokens; ++i) {
    o.tokens.push_back(static_cast<int32_t>((first_token + i) % vocab_size));
  }
  for (size_t k = 0; k < drafter.hidden_layers().size(); ++k) {
    o.hidden.push_back(at::zeros({rows, hidden_size}, options));
  }
  return o;
}

Status Draft(Drafter& drafter) {
  auto trees = drafter.Propose({{.seq = kWarmUpSeq, .max_nodes = 8, .max_depth = 8}});
  if (!trees.ok()) return trees.status();
  if (!trees->empty() && !(*trees)[0].failure().ok()) return (*trees)[0].failure();
  return OkStatus();
}

}  // namespace

Status WarmUpDrafter(Drafter& drafter, const ModelConfig& target,
                     const ModelRunnerOptions& target_options, int64_t prompt_tokens) {
  const int32_t vocab_size = static_cast<int32_t>(target.vocab_size);
  const int64_t hidden_size = target.hidden_size;
  if (vocab_size <= 0 || hidden_size <= 0 || prompt_tokens < 2) {
    return InvalidArgumentError("drafter warm-up: the target has no vocabulary or width");
  }
  auto run = [&]() -> Status {
    bool dtype_ok = false;
    const torch::ScalarType dtype = ParseTorchDtype(target_options.dtype, &dtype_ok);
    if (!dtype_ok) return InvalidArgumentError(StrCat("dtype '", target_options.dtype, "'"));
    const at::TensorOptions hidden_options =
        torch::TensorOptions().dtype(dtype).device(torch::Device(target_options.device));
    RETURN_IF_ERROR(drafter.AddSequence(kWarmUpSeq, SamplingParams{}));
    // A prompt: one hidden row per token but the pending one.
    RETURN_IF_ERROR(drafter.Observe({Observation(drafter, 1, prompt_tokens, prompt_tokens - 1,
                                                 vocab_size, hidden_size, hidden_options)}));
    RETURN_IF_ERROR(Draft(drafter));
    // A steady step: two tokens committed, the old pending one's row and the accepted one's.
    RETURN_IF_ERROR(drafter.Observe({Observation(drafter, static_cast<int32_t>(prompt_tokens + 1),
                                                 2, 2, vocab_size, hidden_size, hidden_options)}));
    return Draft(drafter);
  };
  Status status;
  try {
    status = run();
  } catch (const std::exception& e) {
    status = InternalError(e.what());
  }
  drafter.ReleaseSequence(kWarmUpSeq);
  if (!status.ok()) return status.WithContext(StrCat("drafter '", drafter.name(), "' warm-up"));
  return OkStatus();
}

}  // namespace specula
