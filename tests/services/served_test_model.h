// Fixtures shared by the services tests: a tiny model directory (a byte-level BPE tokenizer trained
// on a little Python, a random 2-layer target with a 1024-position context, and a second random
// model of the same vocabulary as the draft LM), loading it as the router serves it, and the
// plain-decoding reference every served output is compared with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/spec/local_target_backend.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/engine_loop.h"

namespace specula {

struct TestModelDirs {
  std::string target;
  std::string draft;
};

// Written on first use into a temporary directory that is removed when the process exits.
const TestModelDirs& TinyServedModelDirs();

// The n-gram drafter, plus the draft LM in `draft_dir` unless it is empty.
std::vector<std::unique_ptr<Drafter>> LoadTestDrafters(const std::string& target_dir,
                                                       const std::string& draft_dir);
// The target in this process with LoadTestDrafters' drafters; `step_thread` as
// LocalTargetBackend's.
std::unique_ptr<LocalTargetBackend> LoadTargetBackend(const std::string& target_dir,
                                                      const std::string& draft_dir,
                                                      SpecEngineOptions engine = {},
                                                      KvCacheOptions kv = {},
                                                      bool step_thread = false);
// The model as `specula serve --role all` loads it: tokenizer and LoadTargetBackend, its steps
// on a thread of their own (--overlap-steps).
router::ServedModel LoadServedModel(const std::string& target_dir, const std::string& draft_dir,
                                    SpecEngineOptions engine = {}, KvCacheOptions kv = {});

// Plain greedy decoding (DecodeBatch, batch of one) on its own copy of the model in `dir`.
class ReferenceDecoder {
 public:
  explicit ReferenceDecoder(const std::string& dir);
  std::vector<int32_t> Greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                              const std::vector<int32_t>& stop_token_ids = {});
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ModelConfig& config() const { return runner_->config(); }

 private:
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace specula
