// specula eval-lm: perplexity of a model directory on a token file (e.g. the held-out test/ split).
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/train/lm_trainer.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "eval-lm";

}  // namespace

int RunEvalLm(const std::vector<std::string>& args) {
  std::string model, tokens = "data/corpus/heldout.tok";
  int64_t seq_len = 512, batch = 8, max_windows = 0, threads = 0;
  FlagSet flags(kCommand);
  flags.AddString("model", &model, "model directory");
  flags.AddString("tokens", &tokens,
                  "token file to score (prepare-corpus writes train/val/heldout.tok)");
  flags.AddInt("seq-len", &seq_len, "window length");
  flags.AddInt("batch-size", &batch, "windows per forward");
  flags.AddInt("max-windows", &max_windows,
               "score at most this many windows, evenly spread (0 = all)");
  flags.AddInt("threads", &threads, "intra-op CPU threads (0 = LibTorch default)");
  return RunCommand(flags, args, [&]() -> Status {
    if (model.empty()) return InvalidArgumentError("--model is required");
    if (threads > 0) SetThreads(threads);
    ASSIGN_OR_RETURN(double loss, EvaluateModelLoss(model, tokens, seq_len, batch, max_windows));
    nlohmann::json j = {{"model", model},
                        {"tokens", tokens},
                        {"seq_len", seq_len},
                        {"loss", loss},
                        {"perplexity", std::exp(loss)}};
    std::cout << j.dump() << "\n";
    return OkStatus();
  });
}

}  // namespace specula::cli
