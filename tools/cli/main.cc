// specula: the command-line entry point. Dispatches to one subcommand per file.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/model/cpu_runtime.h"
#include "tools/cli/commands.h"
#include "tools/cli/version.h"  // generated (tools/cli/version.h.in)

namespace {

constexpr char kUsage[] =
    "usage: specula <command> [flags]\n"
    "\n"
    "commands:\n"
    "  generate        continue a prompt with a model directory (config.json, safetensors, "
    "tokenizer.json)\n"
    "  bench           speculative decoding vs none: tokens/s, speedup, accepted length, kappa\n"
    "  bench-forward   time one forward vs the number of tokens in it (the draft-budget cost "
    "curve)\n"
    "  bench-policy    the adaptive draft budget's host time per step (plan and learn), no model\n"
    "  prepare-corpus  build the Python-sources corpus, train its tokenizer, write token files\n"
    "  train-lm        train a Llama-style LM (bundled target or draft LM) on a prepared corpus\n"
    "  train-target    train-lm --preset target (the bundled target's shape)\n"
    "  eval-lm         perplexity of a model on a token file (e.g. the held-out split)\n"
    "  distill         self-distillation dataset: target continuations of training-split prompts\n"
    "  train-drafter   train a drafter for a frozen target (--kind "
    "specformer|beagle|parallelspec)\n"
    "                  on the distill dataset\n"
    "  draft-vocab     the tokens the target emits most (distill dataset): a cheaper draft head\n"
    "  serve           gRPC server: the Generation API with speculative decoding, health checks,\n"
    "                  reflection and Prometheus metrics (builds with -DSPECULA_WITH_GRPC=ON)\n"
    "  version         the version and the git commit it was built from (also --version)\n"
    "\n"
    "Run 'specula <command> --help' for the flags of a command.\n";

// "specula 0.1.0 (commit 0123456789ab)", or without the commit when the build did not know it.
void PrintVersion() {
  if (specula::cli::kGitCommit[0] != '\0') {
    std::printf("specula %s (commit %s)\n", specula::cli::kVersion, specula::cli::kGitCommit);
  } else {
    std::printf("specula %s\n", specula::cli::kVersion);
  }
  // Which matmul kernels this process runs (UseFasterBlasKernels may have chosen them).
  const std::string blas = specula::LoadedBlasCore();
  if (!blas.empty()) std::printf("matmuls: OpenBLAS %s kernels\n", blas.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  specula::UseFasterBlasKernels(argv);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  if (command == "--version" || command == "version") {
    PrintVersion();
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "generate") return specula::cli::RunGenerate(args);
  if (command == "bench") return specula::cli::RunBench(args);
  if (command == "bench-forward") return specula::cli::RunBenchForward(args);
  if (command == "bench-policy") return specula::cli::RunBenchPolicy(args);
  if (command == "prepare-corpus") return specula::cli::RunPrepareCorpus(args);
  if (command == "train-lm") return specula::cli::RunTrainLm(args);
  if (command == "train-target") {
    args.insert(args.begin(), {"--preset", "target"});  // a later --preset still wins
    return specula::cli::RunTrainLm(args);
  }
  if (command == "eval-lm") return specula::cli::RunEvalLm(args);
  if (command == "distill") return specula::cli::RunDistill(args);
  if (command == "train-drafter") return specula::cli::RunTrainDrafter(args);
  if (command == "draft-vocab") return specula::cli::RunDraftVocab(args);
  if (command == "serve") {
#ifdef SPECULA_HAVE_SERVE
    return specula::cli::RunServe(args);
#else
    std::fputs(
        "specula serve: this build has no gRPC support; rebuild with -DSPECULA_WITH_GRPC=ON\n",
        stderr);
    return 1;
#endif
  }
  std::fprintf(stderr, "specula: unknown command '%s'\n\n%s", command.c_str(), kUsage);
  return 2;
}
