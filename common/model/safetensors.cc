#include "common/model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

namespace specula {
namespace {

constexpr size_t kMaxHeaderBytes = 100u << 20;  // the format's own limit

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return InvalidArgumentError(StrCat("unknown dtype '", name, "'"));
}

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  const size_t size = file->size();
  if (size < 8) {
    return DataLossError(
        StrCat(path, ": truncated safetensors file (", size, " bytes, need at least 8)"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > kMaxHeaderBytes || 8 + header_len > size) {
    return DataLossError(StrCat(path, ": bad safetensors header length ", header_len, " (file has ",
                                size, " bytes): truncated or not a safetensors file"));
  }
  std::string_view header(reinterpret_cast<const char*>(file->data() + 8), header_len);
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(StrCat(path, ": bad safetensors header: not a JSON object"));
  }
  auto out = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  out->file_ = file;
  const size_t data_begin = 8 + header_len;
  const size_t data_size = size - data_begin;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (v.is_object()) {
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (m.value().is_string()) out->metadata_[m.key()] = m.value().get<std::string>();
        }
      }
      continue;
    }
    auto err = [&](std::string_view what) {
      return DataLossError(StrCat(path, ": tensor '", name, "': ", what));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      return err("header entry needs dtype, shape and data_offsets");
    }
    if (!v["dtype"].is_string()) return err("dtype must be a string");
    auto dtype = ParseDType(v["dtype"].get<std::string>());
    if (!dtype.ok()) {
      return InvalidArgumentError(
          StrCat(path, ": tensor '", name, "': ", dtype.status().message()));
    }
    TensorView t;
    t.name = name;
    t.dtype = *dtype;
    if (!v["shape"].is_array()) return err("shape must be a list");
    // The byte size is computed with overflow checks: a hostile header must not wrap to a small
    // size.
    uint64_t bytes = DTypeSize(t.dtype);
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return err("shape entries must be integers >= 0");
      t.shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d.get<int64_t>()), &bytes)) {
        return err("shape is too large (its byte size overflows)");
      }
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      return err("data_offsets must be [begin, end]");
    }
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return DataLossError(StrCat(path, ": tensor '", name, "': data_offsets [", begin, ", ", end,
                                  "] outside the data section of ", data_size,
                                  " bytes (truncated file?)"));
    }
    t.nbytes = end - begin;
    if (bytes != t.nbytes) {
      return InvalidArgumentError(StrCat(path, ": tensor '", name, "': shape holds ", bytes,
                                         " bytes but data_offsets span ", t.nbytes));
    }
    t.data = file->data() + data_begin + begin;
    out->tensors_.push_back(std::move(t));
  }
  // Tensors may not share bytes (the reference implementation rejects overlaps too).
  std::vector<const TensorView*> by_offset;
  for (const auto& t : out->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->data + by_offset[i - 1]->nbytes > by_offset[i]->data) {
      return DataLossError(StrCat(path, ": tensors '", by_offset[i - 1]->name, "' and '",
                                  by_offset[i]->name, "' overlap"));
    }
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (header.contains(t.name))
      return InvalidArgumentError(StrCat("tensor '", t.name, "' is given twice"));
    if (static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype) != t.nbytes) {
      return InvalidArgumentError(
          StrCat("tensor '", t.name, "': shape does not match its byte size"));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');  // aligns the data section
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return InternalError(StrCat("cannot write ", tmp));
    uint64_t n = text.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors) {
      out.write(reinterpret_cast<const char*>(t.data), static_cast<std::streamsize>(t.nbytes));
    }
    if (!out) return InternalError(StrCat("short write to ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return InternalError(StrCat("cannot rename ", tmp, " to ", path));
  }
  return OkStatus();
}

}  // namespace specula
