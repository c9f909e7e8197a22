#include "tools/cli/target_log_probs.h"

#include <torch/torch.h>

#include <algorithm>

namespace specula::cli {

StatusOr<LogProbSum> TargetLogProbs(ModelRunner& runner,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<std::vector<int32_t>>& outputs,
                                    int64_t batch) {
  if (prompts.size() != outputs.size()) {
    return InvalidArgumentError(
        StrCat("TargetLogProbs: ", prompts.size(), " prompts but ", outputs.size(), " outputs"));
  }
  LogProbSum total;
  c10::InferenceMode inference;
  for (size_t start = 0; start < outputs.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(outputs.size(), start + static_cast<size_t>(batch));
    ForwardBatch forward;
    std::vector<size_t> members;
    for (size_t i = start; i < end; ++i) {
      if (outputs[i].empty() || prompts[i].empty()) continue;
      SequenceChunk chunk;
      chunk.seq = NewSequenceId();
      chunk.tokens = prompts[i];
      chunk.tokens.insert(chunk.tokens.end(), outputs[i].begin(), outputs[i].end());
      chunk.logits = LogitsRows::kExplicit;
      // Row P - 1 + j predicts output token j.
      for (size_t j = 0; j < outputs[i].size(); ++j) {
        chunk.logit_rows.push_back(static_cast<int32_t>(prompts[i].size() - 1 + j));
      }
      forward.seqs.push_back(std::move(chunk));
      members.push_back(i);
    }
    if (members.empty()) continue;
    Status added = OkStatus();
    for (const SequenceChunk& chunk : forward.seqs) {
      if (added.ok()) added = runner.AddSequence(chunk.seq);
    }
    StatusOr<ForwardOutput> out =
        added.ok() ? runner.Forward(forward) : StatusOr<ForwardOutput>(added);
    // The scoring sequences are ours alone: release them whatever happened.
    for (const SequenceChunk& chunk : forward.seqs) {
      if (runner.HasSequence(chunk.seq)) (void)runner.ReleaseSequence(chunk.seq);
    }
    if (!out.ok()) return out.status();
    const at::Tensor log_probs = torch::log_softmax(out->logits.to(torch::kFloat32), -1);
    for (size_t m = 0; m < members.size(); ++m) {
      const std::vector<int32_t>& tokens = outputs[members[m]];
      const int64_t first = out->logits_offset[m];
      const at::Tensor rows = log_probs.narrow(0, first, static_cast<int64_t>(tokens.size()));
      const at::Tensor ids =
          torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kInt64);
      total.sum += rows.gather(1, ids.unsqueeze(1)).sum().item<double>();
      total.tokens += static_cast<int64_t>(tokens.size());
    }
  }
  return total;
}

}  // namespace specula::cli
