// kiln's error types and checks. Two kinds of check, as in c10:
//   KILN_CHECK(cond, msg...)   bad user input; the message names the op, the
//                              shapes, dtypes and devices and what was expected.
//   KILN_ASSERT(cond, msg...)  an internal invariant ("this is a bug in kiln").
// Both throw kiln::Error carrying file:line. The library never exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* file, int line)
      : std::runtime_error(message + " (" + file + ":" + std::to_string(line) + ")"),
        message_(message) {}
  // The message without the source location.
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// Thrown when the device (or host) has no memory left after the caching
// allocator freed its cache and retried once. The batch-size finder catches it.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream stream;
  (stream << ... << args);
  return stream.str();
}
}  // namespace detail

}  // namespace kiln

#define KILN_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      throw ::kiln::Error(::kiln::detail::concat(__VA_ARGS__), __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

#define KILN_ASSERT(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond)) [[unlikely]] {                                                 \
      throw ::kiln::Error(::kiln::detail::concat("internal error (a bug in kiln): ", \
                                                 #cond, " " __VA_OPT__(, ) __VA_ARGS__), \
                          __FILE__, __LINE__);                                  \
    }                                                                           \
  } while (0)

#define KILN_THROW(...) \
  throw ::kiln::Error(::kiln::detail::concat(__VA_ARGS__), __FILE__, __LINE__)
