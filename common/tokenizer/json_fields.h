// Typed access to tokenizer.json fields with errors that name the field.
//
// Every accessor takes the dotted path of the object it reads from
// ("pre_tokenizer.pretokenizers[1]") so that a bad file is reported as e.g.
// "pre_tokenizer.pretokenizers[1].behavior must be a string". Optional accessors treat a missing
// key and JSON null alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/util/status.h"

namespace specula::json_fields {

using Json = nlohmann::json;

// "parent.key", or "key" when `parent` is empty.
std::string Path(std::string_view parent, std::string_view key);
// "parent[index]".
std::string Index(std::string_view parent, size_t index);

// The member `key` of `object`, which must exist and not be null.
StatusOr<const Json*> Required(const Json& object, std::string_view key, std::string_view path);

StatusOr<std::string> String(const Json& object, std::string_view key, std::string_view path);
StatusOr<std::string> StringOr(const Json& object, std::string_view key, std::string_view path,
                               std::string_view fallback);
StatusOr<bool> BoolOr(const Json& object, std::string_view key, std::string_view path,
                      bool fallback);
StatusOr<int64_t> Int(const Json& object, std::string_view key, std::string_view path);
StatusOr<int64_t> IntOr(const Json& object, std::string_view key, std::string_view path,
                        int64_t fallback);
StatusOr<const Json*> Array(const Json& object, std::string_view key, std::string_view path);
StatusOr<const Json*> Object(const Json& object, std::string_view key, std::string_view path);

// A component object's "type" field; `component` itself must be a JSON object.
StatusOr<std::string> Type(const Json& component, std::string_view path);

// UNIMPLEMENTED "<path>.type '<type>' is not supported".
Status UnsupportedType(std::string_view path, std::string_view type);

}  // namespace specula::json_fields
