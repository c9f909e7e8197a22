// The target model as the serving engine sees it: a CausalLM plus its paged KV cache, driven by
// packed ForwardBatches. LibTorch exceptions stop here: every call returns a Status.
//
// Sequence lifecycle: AddSequence -> Forward (appends the new tokens to the cache) -> KeepOnly
// (commit an accepted tree path) / Truncate -> ReleaseSequence. Thread-compatible: one caller at a
// time (the scheduler loop).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "common/kv/paged_kv_cache.h"
#include "common/model/draft_matmul.h"
#include "common/model/forward_batch.h"
#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

struct ModelRunnerOptions {
  std::string device = "cpu";     // "cpu", "cuda", "cuda:N"
  std::string dtype = "float32";  // "float32", "bfloat16", "float16"
  KvCacheOptions kv;
  // float32 CPU forwards of up to kSmallMatmulMaxRows rows run CpuForward (the module's kernels
  // without LibTorch ops; the same results). false: always the module's forward (A/B checks).
  bool cpu_forward = true;
  // CpuForward's matmuls on bfloat16 or int8 copies of the weights where the CPU has them
  // (CpuForward::UseDraftMatmul): faster, no longer the float32 model's exact results. For a
  // draft LM only; a target keeps kFloat32.
  DraftMatmul draft_matmul = DraftMatmul::kFloat32;
  // CpuForward's float32 matmuls on packed copies of the weights where the CPU has AVX-512
  // (CpuForward::UsePackedWeights): the same results, faster at several rows, a second copy of
  // the weights in memory. false: the weights themselves (less memory; A/B checks).
  bool packed_weights = true;
};

struct ForwardOutput {
  at::Tensor logits;                   // [R, vocab] float32, rows of all sequences in batch order
  std::vector<int64_t> logits_offset;  // [B + 1] first logits row of each sequence
  std::vector<at::Tensor> hidden;      // per requested layer: [N, d] in the model dtype
  std::vector<int64_t> token_offset;   // [B + 1] first packed row of each sequence
};

class CausalLMImpl;
}  // namespace specula
namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace specula {

class ModelRunner {
 public:
  // Loads config.json + safetensors from `model_dir`. NOT_FOUND / INVALID_ARGUMENT / DATA_LOSS name
  // the file and field at fault (missing tensor, wrong shape, unknown dtype, ...).
  static StatusOr<std::unique_ptr<ModelRunner>> Load(const std::string& model_dir,
                                                     const ModelRunnerOptions& options);
  // Wraps an in-memory model (training, tests). The module is moved to the options' device/dtype.
  static StatusOr<std::unique_ptr<ModelRunner>> FromModule(std::shared_ptr<CausalLMImpl> module,
                                                           const ModelRunnerOptions& options);
  ~ModelRunner();

  const ModelConfig& config() const;
  std::string device_name() const;
  // The weights' (and hidden states') dtype: "float32", "bfloat16" or "float16".
  std::string dtype_name() const;
  // Waits for the work queued on the device (CUDA runs asynchronously; a no-op on the CPU), so a
  // timer read afterwards measures the work, not its launch.
  void Synchronize() const;

  // ALREADY_EXISTS if the id is in use.
  Status AddSequence(SeqId seq);
  Status ReleaseSequence(SeqId seq);
  bool HasSequence(SeqId seq) const;
  int64_t SequenceLength(SeqId seq) const;

  // Runs one forward. Validation errors (INVALID_ARGUMENT naming the sequence and field,
  // OUT_OF_RANGE past the context length, RESOURCE_EXHAUSTED when the KV cache is full) leave every
  // sequence exactly as it was. On success each sequence's cache has grown by its new tokens.
  StatusOr<ForwardOutput> Forward(const ForwardBatch& batch);

  // Commit an accepted path: keep positions start + offsets[i] (see PagedKvCache::KeepOnly).
  Status KeepOnly(SeqId seq, int64_t start, const std::vector<int64_t>& offsets);
  // Commits the accepted paths of many sequences at once: one copy per step for the whole batch
  // (PagedKvCache::KeepOnlyAll). All or nothing on validation errors.
  Status CommitPaths(const std::vector<PathCommit>& commits);
  Status Truncate(SeqId seq, int64_t length);

  // A draft LM's reduced head: later forwards compute logits for `tokens` only (ids in [0, vocab),
  // no repeats) and return -inf in every other column, so the [R, vocab] contract is unchanged.
  // INVALID_ARGUMENT naming the id at fault. Empty = the whole vocabulary again.
  Status RestrictVocabulary(const std::vector<int32_t>& tokens);

  KvCacheStats kv_stats() const;
  // Read-only view of the cache (tests, metrics).
  const PagedKvCache& kv_cache() const;
  // Positions a new sequence can still grow by, counting free blocks only.
  int64_t free_kv_positions() const;

  // The underlying module (tests, training). Do not run it concurrently with Forward.
  std::shared_ptr<CausalLMImpl> module() const;
  // How its CPU forwards multiply: options.draft_matmul where this CPU has it, else kFloat32
  // (also without a CPU forward).
  DraftMatmul draft_matmul() const;

 private:
  struct Impl;
  explicit ModelRunner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Loads a checkpoint's tensors into a module of the config's shape (a CausalLM, a drafter),
// converting dtype. INVALID_ARGUMENT names a missing tensor or a shape mismatch.
Status LoadWeightsInto(torch::nn::Module& model, const std::string& model_dir);

// Writes an HF-layout model directory: model.safetensors (the module's parameters) and config.json.
Status SaveModelDir(CausalLMImpl& model, const ModelConfig& config, const std::string& dir);

}  // namespace specula
