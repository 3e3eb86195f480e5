// Checked reads of the JSON in saved states (checkpoint metadata, the
// state_dict()s of optimizers, callbacks and loaders). nlohmann's get<T>
// converts what a corrupt or hand-edited file may hold silently or with
// undefined behaviour (a float to an integer: 1.5 -> 1, 1e300 -> UB; a
// negative integer to an unsigned one; a bool to a number), and its own
// exceptions name neither the file nor the key. These accept only the exact
// JSON type, in range, and throw kiln::Error
//   "<where>: "<name>" is <the value as JSON> (expected <what>)"   or
//   "<where>: no "<name>""
// where `where` says whose state it is, e.g. "load checkpoint 'a.safetensors': corrupt metadata".
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kiln::saved_json {

// The largest count (steps, epochs, batches, logged values) a saved state may
// hold: loops and kernels increment counts, and schedules and epoch means use
// them as doubles, exact up to 2^53. No run gets near it.
constexpr int64_t kMaxCount = int64_t{1} << 53;

// Throws the message above for `value`, called `name`, with `expected` ("a list of sizes").
[[noreturn]] void refuse(const nlohmann::json& value, std::string_view name, std::string_view where,
                         std::string_view expected);

// `value` must be a JSON object (`name` in the message).
const nlohmann::json& object(const nlohmann::json& value, std::string_view name, std::string_view where);
// Whether `object` (any JSON value) is an object with `key`: for optional keys.
bool has(const nlohmann::json& object, std::string_view key);

// `value` itself, called `name` in messages.
int64_t integer(const nlohmann::json& value, std::string_view name, std::string_view where,
                int64_t min = std::numeric_limits<int64_t>::min(), int64_t max = std::numeric_limits<int64_t>::max());
uint64_t unsigned_integer(const nlohmann::json& value, std::string_view name, std::string_view where);
double finite_number(const nlohmann::json& value, std::string_view name, std::string_view where);
bool boolean(const nlohmann::json& value, std::string_view name, std::string_view where);
std::string string(const nlohmann::json& value, std::string_view name, std::string_view where);

// The member `key` of `object` (which must be an object holding it).
const nlohmann::json& member(const nlohmann::json& object, std::string_view key, std::string_view where);
inline int64_t integer_at(const nlohmann::json& object, std::string_view key, std::string_view where,
                          int64_t min = std::numeric_limits<int64_t>::min(),
                          int64_t max = std::numeric_limits<int64_t>::max()) {
  return integer(member(object, key, where), key, where, min, max);
}
inline uint64_t unsigned_integer_at(const nlohmann::json& object, std::string_view key, std::string_view where) {
  return unsigned_integer(member(object, key, where), key, where);
}
inline double finite_number_at(const nlohmann::json& object, std::string_view key, std::string_view where) {
  return finite_number(member(object, key, where), key, where);
}
inline bool boolean_at(const nlohmann::json& object, std::string_view key, std::string_view where) {
  return boolean(member(object, key, where), key, where);
}
inline std::string string_at(const nlohmann::json& object, std::string_view key, std::string_view where) {
  return string(member(object, key, where), key, where);
}

}  // namespace kiln::saved_json
