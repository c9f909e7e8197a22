// Fuzzes the internal services' decoding (services/common/engine_codec, tensor_codec): the first
// byte picks the message, the rest is its wire bytes, as a peer could send them. Any bytes give a
// value or an error naming the field, never a crash; what decodes re-encodes and decodes again.
//   0: v1::StepPlan (router -> target)      1: v1::StepResult (target -> router)
//   2: v1::CandidateTree (drafter -> target) 3: v1::Tensor (hidden states, distributions)
//   4: v1::TargetInfo
#include <ATen/core/Tensor.h>

#include <google/protobuf/stubs/logging.h>

#include <cstdint>
#include <string>
#include <vector>

#include "services/common/engine_codec.h"
#include "services/common/tensor_codec.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace specula;

constexpr int32_t kVocab = 64;

void CheckError(const Status& status) {
  if (status.ok() || status.message().empty()) fuzz::Fail("an error without a message");
}

void StepPlanCase(std::string_view bytes) {
  v1::StepPlan message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  auto plan = services::FromProto(message);
  if (!plan.ok()) return CheckError(plan.status());
  v1::StepPlan again;
  services::ToProto(*plan, &again);
  if (!services::FromProto(again).ok()) fuzz::Fail("a decoded StepPlan does not round-trip");
}

void StepResultCase(std::string_view bytes) {
  v1::StepResult message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  StepOutcome outcome = services::FromProto(message);
  v1::StepResult again;
  services::ToProto(outcome, &again);
}

void TreeCase(std::string_view bytes) {
  v1::CandidateTree message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  auto tree = services::FromProto(message, kVocab, "propose.trees[0]");
  if (!tree.ok()) return CheckError(tree.status());
  v1::CandidateTree again;
  if (!services::ToProto(*tree, &again).ok()) fuzz::Fail("a decoded tree does not encode");
  if (!services::FromProto(again, kVocab, "again").ok()) {
    fuzz::Fail("a decoded tree does not round-trip");
  }
}

void TensorCase(std::string_view bytes) {
  v1::Tensor message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  if (message.shape_size() > 8) return;  // shapes are checked against an expected rank anyway
  const std::vector<int64_t> any(static_cast<size_t>(message.shape_size()), -1);
  auto tensor = services::DecodeTensor(message, "observe.hidden[0]", message.dtype(), any);
  if (!tensor.ok()) return CheckError(tensor.status());
  v1::Tensor again;
  if (!services::EncodeTensor(*tensor, &again).ok()) fuzz::Fail("a decoded tensor does not encode");
  if (again.data() != message.data()) fuzz::Fail("a tensor's bytes change in a round trip");
}

void TargetInfoCase(std::string_view bytes) {
  v1::TargetInfo message;
  if (!message.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;
  TargetInfo info = services::FromProto(message);
  v1::TargetInfo again;
  services::ToProto(info, &again);
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; quiet, or the log is all the fuzzer does.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes = fuzz::AsText(data + 1, size - 1);
  try {
    switch (data[0] % 5) {
      case 0:
        StepPlanCase(bytes);
        break;
      case 1:
        StepResultCase(bytes);
        break;
      case 2:
        TreeCase(bytes);
        break;
      case 3:
        TensorCase(bytes);
        break;
      case 4:
        TargetInfoCase(bytes);
        break;
    }
  } catch (const std::exception& e) {
    // The codecs promise Status, never exceptions (a LibTorch exception would end a server thread).
    std::fprintf(stderr, "exception: %s\n", e.what());
    fuzz::Fail("an exception escaped the codec");
  }
  return 0;
}
