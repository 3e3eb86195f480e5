#include "core/saved_json.h"

#include <cmath>

#include "kernels/error.h"

namespace kiln::saved_json {

namespace {
// The value as JSON for a message, cut short: a corrupt file may hold megabytes in one value.
std::string shown(const nlohmann::json& value) {
  constexpr size_t kMaxShown = 80;
  if (value.is_binary()) return std::to_string(value.get_binary().size()) + " bytes of binary data";
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxShown) text = text.substr(0, kMaxShown) + "...";
  return text;
}
}  // namespace

void refuse(const nlohmann::json& value, std::string_view name, std::string_view where, std::string_view expected) {
  KILN_THROW(where, ": \"", name, "\" is ", shown(value), " (expected ", expected, ")");
}

const nlohmann::json& object(const nlohmann::json& value, std::string_view name, std::string_view where) {
  if (!value.is_object()) refuse(value, name, where, "a JSON object");
  return value;
}

bool has(const nlohmann::json& object, std::string_view key) {
  return object.is_object() && object.contains(key);
}

const nlohmann::json& member(const nlohmann::json& object, std::string_view key, std::string_view where) {
  KILN_CHECK(object.is_object(), where, ": ", shown(object), " is not a JSON object (expected one with \"", key,
             "\")");
  auto it = object.find(key);
  KILN_CHECK(it != object.end(), where, ": no \"", key, "\"");
  return *it;
}

int64_t integer(const nlohmann::json& value, std::string_view name, std::string_view where, int64_t min,
                int64_t max) {
  // A non-negative integer parsed from text is nlohmann's unsigned kind, up to 2^64 - 1.
  const bool representable =
      value.is_number_unsigned()
          ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
          : value.is_number_integer();
  if (representable && value.get<int64_t>() >= min && value.get<int64_t>() <= max) return value.get<int64_t>();
  constexpr int64_t kLowest = std::numeric_limits<int64_t>::min(), kHighest = std::numeric_limits<int64_t>::max();
  if (min == kLowest && max == kHighest) refuse(value, name, where, "an integer");
  if (max == kHighest) refuse(value, name, where, "an integer >= " + std::to_string(min));
  refuse(value, name, where, "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

uint64_t unsigned_integer(const nlohmann::json& value, std::string_view name, std::string_view where) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  // A state made in memory (not read from a file) holds non-negative integers as signed ones.
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return static_cast<uint64_t>(value.get<int64_t>());
  refuse(value, name, where, "a non-negative integer");
}

double finite_number(const nlohmann::json& value, std::string_view name, std::string_view where) {
  // nlohmann's is_number() is false for bools; a state made in memory may hold infinity or NaN.
  if (!value.is_number() || !std::isfinite(value.get<double>())) refuse(value, name, where, "a finite number");
  return value.get<double>();
}

bool boolean(const nlohmann::json& value, std::string_view name, std::string_view where) {
  if (!value.is_boolean()) refuse(value, name, where, "true or false");
  return value.get<bool>();
}

std::string string(const nlohmann::json& value, std::string_view name, std::string_view where) {
  if (!value.is_string()) refuse(value, name, where, "a string");
  return value.get<std::string>();
}

}  // namespace kiln::saved_json
