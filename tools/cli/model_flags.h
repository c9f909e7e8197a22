// Flags every model-loading command shares (--model, --device, --dtype, --kv-memory-mb, --threads)
// and the code that turns them into a loaded ModelRunner.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/model/model_runner.h"
#include "common/util/flags.h"

namespace specula::cli {

struct ModelFlags {
  std::string model;
  std::string device = "cpu";
  std::string dtype = "float32";
  double kv_memory_mb = 512;
  int64_t kv_block_size = 16;
  int64_t threads = 0;
  bool cpu_packed_weights = true;

  void Register(FlagSet& flags);
  // NOT_FOUND etc. from loading; INVALID_ARGUMENT if --model is missing.
  StatusOr<std::unique_ptr<ModelRunner>> Load() const;
};

// Sets LibTorch's intra-op thread count.
void SetThreads(int64_t threads);

// Prints "specula <command>: <status message>" to stderr and returns exit code 1.
int ReportError(const std::string& command, const Status& status);

// The shared shape of every subcommand: parse `args` into `flags` (usage on --help), call `run`,
// report its error. Returns the process exit code.
int RunCommand(FlagSet& flags, const std::vector<std::string>& args,
               const std::function<Status()>& run);

}  // namespace specula::cli
