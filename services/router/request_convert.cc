#include "services/router/request_convert.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <map>
#include <random>

namespace specula::router {
namespace {

Status CheckIds(const google::protobuf::RepeatedField<int32_t>& ids, const std::string& field,
                int32_t vocab) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return InvalidArgumentError(
          StrCat(field, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return OkStatus();
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

StatusOr<SpeculationSettings> ToSpeculation(const v1::Speculation& s, const EngineInfo& info) {
  SpeculationSettings out;
  out.verify = info.verify_defaults;
  out.drafter = s.drafter().empty() ? info.default_drafter : s.drafter();
  if (out.drafter != "none" &&
      std::find(info.drafters.begin(), info.drafters.end(), out.drafter) == info.drafters.end()) {
    std::string known = "none";
    for (const std::string& d : info.drafters) known += ", " + d;
    return InvalidArgumentError(StrCat("speculation.drafter: unknown drafter '", out.drafter,
                                       "' (available: ", known, ")"));
  }
  if (s.max_draft_tokens() < 0) {
    return InvalidArgumentError(
        StrCat("speculation.max_draft_tokens must be >= 0, got ", s.max_draft_tokens()));
  }
  out.max_draft_tokens =
      s.max_draft_tokens() == 0 ? info.default_max_draft_tokens : s.max_draft_tokens();
  switch (s.verify()) {
    case v1::VERIFY_MODE_UNSPECIFIED:
    case v1::VERIFY_MODE_LOSSLESS:
      out.verify.mode = VerifyMode::kLossless;
      break;
    case v1::VERIFY_MODE_SPECDEC:
      out.verify.mode = VerifyMode::kSpecDec;
      break;
    case v1::VERIFY_MODE_TYPICAL:
      out.verify.mode = VerifyMode::kTypical;
      break;
    default:
      return InvalidArgumentError(
          StrCat("speculation.verify: unknown verification mode ", static_cast<int>(s.verify())));
  }
  if (s.has_specdec_beta()) out.verify.specdec_beta = s.specdec_beta();
  if (s.has_specdec_tau()) out.verify.specdec_tau = s.specdec_tau();
  if (s.has_typical_epsilon()) out.verify.typical_epsilon = s.typical_epsilon();
  if (s.has_typical_delta()) out.verify.typical_delta = s.typical_delta();
  Status valid = out.verify.Validate();
  if (!valid.ok()) return Status(valid.code(), "speculation." + valid.message());
  return out;
}

// Walks the fields of one serialized message; returns the first string field (with its path)
// that is not UTF-8, recursing into message fields.
Status FindInvalidUtf8(const google::protobuf::Descriptor* descriptor, std::string_view bytes,
                       const std::string& prefix, int depth) {
  using google::protobuf::FieldDescriptor;
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  std::map<int, int> seen;  // field number -> occurrences (repeated fields' indices)
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return OkStatus();
    const FieldDescriptor* field =
        descriptor->FindFieldByNumber(WireFormatLite::GetTagFieldNumber(tag));
    if (field == nullptr ||
        WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED ||
        (field->type() != FieldDescriptor::TYPE_STRING &&
         field->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(&in, tag)) return InvalidArgumentError("malformed message");
      if (field != nullptr) ++seen[field->number()];
      continue;
    }
    const int index = seen[field->number()]++;
    std::string name = prefix + field->name();
    if (field->is_repeated()) name += StrCat("[", index, "]");
    uint32_t length = 0;
    std::string value;
    if (!in.ReadVarint32(&length) || !in.ReadString(&value, static_cast<int>(length))) {
      return InvalidArgumentError(StrCat(name, ": malformed message"));
    }
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      const int64_t bad = FirstInvalidUtf8(value);
      if (bad >= 0)
        return InvalidArgumentError(StrCat(name, " is not valid UTF-8 (byte ", bad, ")"));
    } else if (depth < 16) {
      RETURN_IF_ERROR(FindInvalidUtf8(field->message_type(), value, name + ".", depth + 1));
    }
  }
}

}  // namespace

int64_t FirstInvalidUtf8(std::string_view s) {
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong forms
      if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n || b[i + 1] < lo || b[i + 1] > hi) return static_cast<int64_t>(i);
    for (size_t k = 2; k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
    }
    i += len;
  }
  return -1;
}

Status DiagnoseUnparsable(const google::protobuf::Descriptor* descriptor, std::string_view bytes) {
  RETURN_IF_ERROR(FindInvalidUtf8(descriptor, bytes, "", 0));
  return InvalidArgumentError(StrCat("malformed ", descriptor->name(), " message"));
}

StatusOr<LoopRequest> ToLoopRequest(const v1::GenerateRequest& r, const EngineInfo& info,
                                    const Tokenizer& tokenizer, int64_t max_prompt_bytes) {
  LoopRequest out;
  GenerationRequest& g = out.spec.generation;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (r.text().empty()) return InvalidArgumentError("prompt is empty: text is \"\"");
      // Refused before tokenization, which costs time in the size of the text.
      if (static_cast<int64_t>(r.text().size()) > max_prompt_bytes) {
        return InvalidArgumentError(StrCat("text is ", r.text().size(),
                                           " bytes, over the server's limit of ", max_prompt_bytes,
                                           " (--max-prompt-bytes)"));
      }
      const int64_t bad = FirstInvalidUtf8(r.text());
      if (bad >= 0) return InvalidArgumentError(StrCat("text is not valid UTF-8 (byte ", bad, ")"));
      g.prompt = tokenizer.Encode(r.text(), /*add_special_tokens=*/true);
      if (g.prompt.empty()) return InvalidArgumentError("text encodes to no tokens");
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      if (r.token_ids().ids().empty()) {
        return InvalidArgumentError("prompt is empty: token_ids has no ids");
      }
      RETURN_IF_ERROR(CheckIds(r.token_ids().ids(), "token_ids", info.vocab_size));
      g.prompt.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      break;
    default:
      return InvalidArgumentError("prompt is empty: set text or token_ids");
  }
  const int64_t prompt = static_cast<int64_t>(g.prompt.size());
  if (r.has_max_new_tokens()) {
    g.max_new_tokens = r.max_new_tokens();
    if (g.max_new_tokens <= 0) {
      return InvalidArgumentError(
          StrCat("max_new_tokens must be positive, got ", g.max_new_tokens));
    }
  } else {
    g.max_new_tokens = std::max<int64_t>(1, info.context_length - prompt);
  }
  if (prompt >= info.context_length) {
    return OutOfRangeError(StrCat("prompt of ", prompt,
                                  " tokens is longer than the context length of ",
                                  info.context_length, " (leave room for at least one new token)"));
  }
  if (prompt + g.max_new_tokens > info.context_length) {
    return OutOfRangeError(StrCat("max_new_tokens ", g.max_new_tokens, " plus the prompt's ",
                                  prompt, " tokens exceeds the context length of ",
                                  info.context_length));
  }

  const v1::SamplingParams& s = r.sampling();
  g.sampling.temperature = s.temperature();
  g.sampling.top_k = s.top_k();
  g.sampling.top_p = s.has_top_p() ? s.top_p() : 1.0f;
  g.sampling.seed = s.has_seed() ? s.seed() : RandomSeed();
  Status sampling = g.sampling.Validate();
  if (!sampling.ok()) return Status(sampling.code(), "sampling." + sampling.message());

  for (int i = 0; i < r.stop_size(); ++i) {
    if (r.stop(i).empty()) return InvalidArgumentError(StrCat("stop[", i, "] is empty"));
    out.stop_strings.push_back(r.stop(i));
  }
  RETURN_IF_ERROR(CheckIds(r.stop_token_ids(), "stop_token_ids", info.vocab_size));
  g.stop_token_ids.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
  if (!r.ignore_eos()) {
    for (int32_t eos : info.eos_token_ids) {
      if (std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), eos) ==
          g.stop_token_ids.end()) {
        g.stop_token_ids.push_back(eos);
      }
    }
  }
  ASSIGN_OR_RETURN(out.spec.speculation, ToSpeculation(r.speculation(), info));
  return out;
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void FillSpecStats(const SpeculationSettings& settings, const SpecRequestStats& stats,
                   v1::SpecStats* out) {
  const bool on = settings.enabled();
  out->set_drafter(on ? settings.drafter : "none");
  out->set_max_draft_tokens(on ? settings.max_draft_tokens : 0);
  out->set_verify(ToProto(settings.verify.mode));
  out->set_lossy(stats.lossy);
  out->set_steps(stats.steps);
  out->set_draft_steps(stats.draft_steps);
  out->set_draft_tokens(stats.draft_tokens);
  out->set_accepted_tokens(stats.accepted_tokens);
  out->set_mean_accepted_len(stats.mean_accepted_len());
  for (int64_t n : stats.accepted_per_position) out->add_accepted_per_position(n);
  out->set_draft_errors(stats.draft_errors);
}

void FillServerInfo(const EngineInfo& info, const LoadSnapshot& load, v1::ServerInfo* out) {
  out->set_model_name(info.model_name);
  out->set_model_path(info.model_path);
  out->set_model_type(info.model_type);
  out->set_vocab_size(info.vocab_size);
  out->set_context_length(info.context_length);
  for (int32_t id : info.eos_token_ids) out->add_eos_token_ids(id);
  for (const std::string& d : info.drafters) out->add_drafters(d);
  out->set_default_drafter(info.default_drafter);
  out->set_default_max_draft_tokens(info.default_max_draft_tokens);
  out->mutable_limits()->set_max_queue(info.max_queue);
  out->mutable_limits()->set_max_batch_size(info.max_batch_size);
  for (VerifyMode mode : {VerifyMode::kLossless, VerifyMode::kSpecDec, VerifyMode::kTypical}) {
    v1::VerifyModeInfo* m = out->add_verify_modes();
    m->set_mode(ToProto(mode));
    m->set_name(VerifyModeName(mode));
    m->set_lossy(mode != VerifyMode::kLossless);
  }
  v1::ServerLoad* l = out->mutable_load();
  l->set_running(load.running);
  l->set_waiting(load.waiting);
  l->set_kv_cache_blocks_used(load.kv_cache_blocks_used);
  l->set_kv_cache_blocks_total(load.kv_cache_blocks_total);
  l->set_kv_cache_usage(load.kv_cache_blocks_total > 0
                            ? static_cast<double>(load.kv_cache_blocks_used) /
                                  static_cast<double>(load.kv_cache_blocks_total)
                            : 0.0);
  out->set_version(SPECULA_VERSION);
}

}  // namespace specula::router
