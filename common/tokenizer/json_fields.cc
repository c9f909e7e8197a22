#include "common/tokenizer/json_fields.h"

#include <nlohmann/json.hpp>

namespace specula::json_fields {
namespace {

Status WrongType(std::string_view path, std::string_view expected, const Json& value) {
  return InvalidArgumentError(StrCat(path, " must be ", expected, ", got ", value.type_name()));
}

// The member or nullptr when missing or null.
const Json* Find(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

std::string Path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : StrCat(parent, ".", key);
}

std::string Index(std::string_view parent, size_t index) { return StrCat(parent, "[", index, "]"); }

StatusOr<const Json*> Required(const Json& object, std::string_view key, std::string_view path) {
  if (!object.is_object()) return WrongType(path, "an object", object);
  const Json* value = Find(object, key);
  if (value == nullptr) return InvalidArgumentError(StrCat(Path(path, key), " is missing"));
  return value;
}

StatusOr<std::string> String(const Json& object, std::string_view key, std::string_view path) {
  ASSIGN_OR_RETURN(const Json* value, Required(object, key, path));
  if (!value->is_string()) return WrongType(Path(path, key), "a string", *value);
  return value->get<std::string>();
}

StatusOr<std::string> StringOr(const Json& object, std::string_view key, std::string_view path,
                               std::string_view fallback) {
  if (Find(object, key) == nullptr) return std::string(fallback);
  return String(object, key, path);
}

StatusOr<bool> BoolOr(const Json& object, std::string_view key, std::string_view path,
                      bool fallback) {
  const Json* value = Find(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return WrongType(Path(path, key), "a boolean", *value);
  return value->get<bool>();
}

StatusOr<int64_t> Int(const Json& object, std::string_view key, std::string_view path) {
  ASSIGN_OR_RETURN(const Json* value, Required(object, key, path));
  if (!value->is_number_integer()) return WrongType(Path(path, key), "an integer", *value);
  return value->get<int64_t>();
}

StatusOr<int64_t> IntOr(const Json& object, std::string_view key, std::string_view path,
                        int64_t fallback) {
  if (Find(object, key) == nullptr) return fallback;
  return Int(object, key, path);
}

StatusOr<const Json*> Array(const Json& object, std::string_view key, std::string_view path) {
  ASSIGN_OR_RETURN(const Json* value, Required(object, key, path));
  if (!value->is_array()) return WrongType(Path(path, key), "an array", *value);
  return value;
}

StatusOr<const Json*> Object(const Json& object, std::string_view key, std::string_view path) {
  ASSIGN_OR_RETURN(const Json* value, Required(object, key, path));
  if (!value->is_object()) return WrongType(Path(path, key), "an object", *value);
  return value;
}

StatusOr<std::string> Type(const Json& component, std::string_view path) {
  if (!component.is_object()) return WrongType(path, "an object", component);
  return String(component, "type", path);
}

Status UnsupportedType(std::string_view path, std::string_view type) {
  return UnimplementedError(StrCat(path, ".type '", type, "' is not supported"));
}

}  // namespace specula::json_fields
