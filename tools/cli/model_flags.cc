#include "tools/cli/model_flags.h"

#include <torch/torch.h>

#include "common/model/cpu_runtime.h"

#include <cstdio>
#include <iostream>

namespace specula::cli {

void ModelFlags::Register(FlagSet& flags) {
  flags.AddString("model", &model, "model directory: config.json, *.safetensors, tokenizer.json");
  flags.AddString("device", &device, "cpu, cuda or cuda:N");
  flags.AddString("dtype", &dtype, "float32, bfloat16 or float16");
  flags.AddDouble("kv-memory-mb", &kv_memory_mb, "KV cache budget in MB");
  flags.AddInt("kv-block-size", &kv_block_size, "positions per KV block");
  flags.AddInt("threads", &threads, "CPU threads for LibTorch and OpenBLAS (0 = one per core)");
  flags.AddBool("cpu-packed-weights", &cpu_packed_weights,
                "float32 CPU forwards of up to 128 rows read a packed copy of the model's weights "
                "where the CPU has AVX-512: the same results, faster at several rows (verified "
                "drafts, batches), twice the weight memory; false: the weights themselves");
}

StatusOr<std::unique_ptr<ModelRunner>> ModelFlags::Load() const {
  if (model.empty()) return InvalidArgumentError("--model is required");
  SetThreads(threads);
  ConfigureAllocatorForServing();
  ModelRunnerOptions options;
  options.device = device;
  options.dtype = dtype;
  options.kv.memory_mb = kv_memory_mb;
  options.kv.block_size = kv_block_size;
  options.packed_weights = cpu_packed_weights;
  return ModelRunner::Load(model, options);
}

void SetThreads(int64_t threads) { ConfigureCpuThreads(threads); }

int ReportError(const std::string& command, const Status& status) {
  std::fprintf(stderr, "specula %s: %s\n", command.c_str(), status.ToString().c_str());
  return 1;
}

int RunCommand(FlagSet& flags, const std::vector<std::string>& args,
               const std::function<Status()>& run) {
  Status parsed = flags.Parse(args);
  if (!parsed.ok()) return ReportError(flags.command(), parsed);
  if (flags.help_requested()) {
    std::cout << flags.Usage();
    return 0;
  }
  Status s = run();
  return s.ok() ? 0 : ReportError(flags.command(), s);
}

}  // namespace specula::cli
