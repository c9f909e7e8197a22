#include "common/tokenizer/stream_decoder.h"

#include "common/tokenizer/utf8.h"

namespace specula {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

StatusOr<std::string> StreamDecoder::Push(int32_t id) {
  // A skipped special token decodes to nothing and must not become the context either: the next
  // token would then be decoded as if it came first.
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return std::string();

  std::vector<int32_t> window = context_;
  window.push_back(id);
  ASSIGN_OR_RETURN(std::string bytes, tokenizer_.DecodeBytes(window, skip_special_tokens_));
  if (!bytes.starts_with(context_bytes_)) {
    // Every supported decoder extends the decoding of a prefix of tokens; this would be a bug.
    return InternalError(StrCat("decoding token ", id, " after token ", context_.front(),
                                " changed the text decoded for the earlier token"));
  }
  pending_.append(bytes, context_bytes_.size());
  context_.assign(1, id);
  ASSIGN_OR_RETURN(context_bytes_, tokenizer_.DecodeBytes(context_, skip_special_tokens_));

  const size_t complete = pending_.size() - utf8::IncompleteTailLength(pending_);
  std::string out = utf8::ToValid(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = utf8::ToValid(pending_);
  pending_.clear();
  return out;
}

}  // namespace specula
