#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/utf8.h"

namespace specula::byte_level {
namespace {

constexpr int kMaxCodePoint = 256 + 68;

struct Alphabet {
  std::array<std::string, 256> byte_to_char;
  std::array<int, kMaxCodePoint> char_to_byte;

  Alphabet() {
    char_to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      utf8::Append(static_cast<char32_t>(cp), &byte_to_char[b]);
      char_to_byte[cp] = b;
    }
  }
};

const Alphabet& GetAlphabet() {
  static const Alphabet* const alphabet = new Alphabet();
  return *alphabet;
}

}  // namespace

std::string_view ByteToChar(uint8_t byte) { return GetAlphabet().byte_to_char[byte]; }

int CharToByte(int cp) {
  return cp >= 0 && cp < kMaxCodePoint ? GetAlphabet().char_to_byte[cp] : -1;
}

std::string Encode(std::string_view bytes) {
  const Alphabet& alphabet = GetAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out.append(alphabet.byte_to_char[static_cast<uint8_t>(c)]);
  return out;
}

bool Decode(std::string_view token, std::string* out) {
  const size_t initial_size = out->size();
  for (size_t pos = 0; pos < token.size();) {
    size_t length = 0;
    const int byte = CharToByte(utf8::DecodeAt(token, pos, &length));
    if (byte < 0) {
      out->resize(initial_size);
      return false;
    }
    out->push_back(static_cast<char>(byte));
    pos += length;
  }
  return true;
}

}  // namespace specula::byte_level
