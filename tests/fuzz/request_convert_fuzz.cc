// Fuzzes the public API's request conversion (services/router/request_convert): the bytes are a
// GenerateRequest as a client could send it. A message that does not parse must get a diagnosis
// (DiagnoseUnparsable); one that parses converts to a LoopRequest or an error whose message starts
// with a field name; a converted request has its tokens inside the vocabulary and a positive
// max_new_tokens within the context.
#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "services/router/request_convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace specula;

const Tokenizer& Bundled() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t =
        Tokenizer::FromFile(std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-6m/tokenizer.json");
    if (!t.ok()) fuzz::Fail("cannot load models/pyllama-6m/tokenizer.json");
    return std::move(*t);
  }();
  return *tokenizer;
}

router::EngineInfo Info() {
  router::EngineInfo info;
  info.model_name = "pyllama-6m";
  info.vocab_size = Bundled().vocab_size();
  info.context_length = 512;
  info.eos_token_ids = {0};
  info.drafters = {"ngram", "beagle"};
  info.default_drafter = "ngram";
  info.default_max_draft_tokens = 4;
  info.max_queue = 16;
  info.max_batch_size = 8;
  info.kv_cache_blocks = 64;
  info.kv_block_size = 16;
  return info;
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; quiet, or the log is all the fuzzer does.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const router::EngineInfo info = Info();
  const std::string_view bytes = fuzz::AsText(data, size);
  (void)router::FirstInvalidUtf8(bytes);
  v1::GenerateRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    const Status why = router::DiagnoseUnparsable(v1::GenerateRequest::descriptor(), bytes);
    if (why.code() != StatusCode::kInvalidArgument || why.message().empty()) {
      fuzz::Fail("an unparsable request without an INVALID_ARGUMENT diagnosis");
    }
    return 0;
  }
  auto converted = router::ToLoopRequest(request, info, Bundled(), /*max_prompt_bytes=*/4096);
  if (!converted.ok()) {
    if (converted.status().message().empty()) fuzz::Fail("an error without a message");
    return 0;
  }
  const GenerationRequest& g = converted->spec.generation;
  for (int32_t id : g.prompt) {
    if (id < 0 || id >= info.vocab_size) fuzz::Fail("a prompt token outside the vocabulary");
  }
  if (g.max_new_tokens <= 0) fuzz::Fail("a non-positive max_new_tokens");
  return 0;
}
