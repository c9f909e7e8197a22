// Subcommands of the `specula` CLI. Each takes the arguments after its name and returns the process
// exit code; errors are printed to stderr as "specula <command>: <message>".
#pragma once

#include <string>
#include <vector>

namespace specula::cli {

int RunGenerate(const std::vector<std::string>& args);
int RunBench(const std::vector<std::string>& args);
int RunBenchForward(const std::vector<std::string>& args);
int RunBenchPolicy(const std::vector<std::string>& args);
int RunPrepareCorpus(const std::vector<std::string>& args);
int RunTrainLm(const std::vector<std::string>& args);
int RunDistill(const std::vector<std::string>& args);
int RunEvalLm(const std::vector<std::string>& args);
int RunTrainDrafter(const std::vector<std::string>& args);
int RunDraftVocab(const std::vector<std::string>& args);
// Only in builds with -DSPECULA_WITH_GRPC=ON (SPECULA_HAVE_SERVE).
int RunServe(const std::vector<std::string>& args);

}  // namespace specula::cli
