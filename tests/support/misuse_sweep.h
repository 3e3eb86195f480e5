// The sweeps of bad arguments and API misuse (tests/test_api_bad_arguments.cpp,
// tests/test_api_misuse.cpp): a Sweep runs each case and requires a kiln::Error
// naming given words, a normal return (and a right answer), or either; it
// collects the failures and reports them all at the end of a test case, so one
// bad case hides none of the rest. A CrashReporter names the running case on a
// fatal signal, and aborts a case that hangs.
#pragma once

#include <doctest/doctest.h>
#include <cxxabi.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "kernels/error.h"

namespace kiln::testing::sweep {

// ---------------------------------------------------------------- reporting a crash or a hang

inline char g_crash_line[1024] = {};  // written by set_case, read by the signal handlers (no allocation there)
inline char g_hang_line[256] = {};    // written by CrashReporter, read by on_alarm
inline std::string g_where;           // the case running now (INFO'd by every test case)
inline const char* g_label = "sweep";  // the test file, in the crash and hang lines
inline unsigned g_hang_seconds = 60;

inline void write_line(const char* line) {
  size_t length = 0;
  while (line[length] != 0) ++length;
  [[maybe_unused]] ssize_t written = write(STDERR_FILENO, line, length);
}

inline constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
inline struct sigaction g_previous[std::size(kFatalSignals)];

inline void on_fatal_signal(int signal) {
  write_line(g_crash_line);
  for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
    if (kFatalSignals[i] == signal) sigaction(signal, &g_previous[i], nullptr);
  }
  raise(signal);
}

inline void on_alarm(int) {
  write_line(g_hang_line);
  write_line(g_crash_line);
  std::abort();
}

// Installs the handlers for one test case of the file `label`; each case may
// run `hang_seconds` (set_case re-arms the alarm).
class CrashReporter {
 public:
  CrashReporter(const char* label, unsigned hang_seconds) {
    g_label = label;
    g_hang_seconds = hang_seconds;
    std::snprintf(g_hang_line, sizeof g_hang_line, "%s: hang (> %u s): ", label, hang_seconds);
    for (size_t i = 0; i < std::size(kFatalSignals); ++i) {
      struct sigaction action {};
      action.sa_handler = on_fatal_signal;
      sigemptyset(&action.sa_mask);
      sigaction(kFatalSignals[i], &action, &g_previous[i]);
    }
    struct sigaction alarm_action {};
    alarm_action.sa_handler = on_alarm;
    sigemptyset(&alarm_action.sa_mask);
    sigaction(SIGALRM, &alarm_action, &previous_alarm_);
  }
  ~CrashReporter() {
    alarm(0);
    for (size_t i = 0; i < std::size(kFatalSignals); ++i) sigaction(kFatalSignals[i], &g_previous[i], nullptr);
    sigaction(SIGALRM, &previous_alarm_, nullptr);
  }
  CrashReporter(const CrashReporter&) = delete;
  CrashReporter& operator=(const CrashReporter&) = delete;

 private:
  struct sigaction previous_alarm_ {};
};

inline void set_case(const std::string& text) {
  g_where = text;
  std::snprintf(g_crash_line, sizeof g_crash_line, "%s: crashed in %s\n", g_label, text.c_str());
  alarm(g_hang_seconds);
}

inline std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> result(abi::__cxa_demangle(name, nullptr, nullptr, &status), std::free);
  return status == 0 && result ? std::string(result.get()) : std::string(name);
}

// ---------------------------------------------------------------- the sweep

// Runs cases and collects failures; finish() reports them all.
class Sweep {
 public:
  // `fn` must throw kiln::Error whose message holds every word of `words`.
  template <typename Fn>
  void refuses(const std::string& what, std::vector<std::string> words, Fn&& fn) {
    set_case(what);
    ++cases_;
    try {
      fn();
      fail(what, "was accepted (expected a kiln::Error naming " + join(words) + ")");
    } catch (const Error& error) {
      check_words(what, words, error);
    } catch (const std::exception& error) {
      fail(what, "threw " + demangled(typeid(error).name()) + ": " + error.what());
    } catch (...) {
      fail(what, "threw an exception of unknown type");
    }
  }

  // `fn` must return normally; when it returns a string, a non-empty one is a
  // wrong answer.
  template <typename Fn>
  void works(const std::string& what, Fn&& fn) {
    set_case(what);
    ++cases_;
    try {
      run(what, fn);
    } catch (const Error& error) {
      fail(what, "threw kiln::Error: " + error.message());
    } catch (const std::exception& error) {
      fail(what, "threw " + demangled(typeid(error).name()) + ": " + error.what());
    } catch (...) {
      fail(what, "threw an exception of unknown type");
    }
  }

  // Either outcome is fine (where torch and kiln may differ in strictness), as
  // long as it is one of the two: a right answer or a kiln::Error naming `words`.
  template <typename Fn>
  void works_or_refuses(const std::string& what, std::vector<std::string> words, Fn&& fn) {
    set_case(what);
    ++cases_;
    try {
      run(what, fn);
    } catch (const Error& error) {
      check_words(what, words, error);
    } catch (const std::exception& error) {
      fail(what, "threw " + demangled(typeid(error).name()) + ": " + error.what());
    } catch (...) {
      fail(what, "threw an exception of unknown type");
    }
  }

  void finish() {
    alarm(0);
    g_where = "(between cases)";
    std::string report;
    for (const std::string& failure : failures_) report += "\n  " + failure;
    INFO(cases_ << " cases, " << failures_.size() << " failures:" << report);
    CHECK(failures_.empty());
    total_cases() += cases_;
  }

  static int& total_cases() {
    static int total = 0;
    return total;
  }

 private:
  template <typename Fn>
  void run(const std::string& what, Fn& fn) {
    if constexpr (std::is_same_v<decltype(fn()), std::string>) {
      const std::string problem = fn();
      if (!problem.empty()) fail(what, problem);
    } else {
      fn();
    }
  }
  void check_words(const std::string& what, const std::vector<std::string>& words, const Error& error) {
    if (error.message().rfind("internal error", 0) == 0) {
      fail(what, "hit an internal check: " + error.message());
      return;
    }
    for (const std::string& word : words) {
      if (error.message().find(word) == std::string::npos) {
        fail(what, "threw kiln::Error without '" + word + "': " + error.message());
        return;
      }
    }
  }
  static std::string join(const std::vector<std::string>& words) {
    std::string text;
    for (const std::string& word : words) text += (text.empty() ? "'" : ", '") + word + "'";
    return text;
  }
  void fail(const std::string& what, const std::string& problem) { failures_.push_back(what + ": " + problem); }

  std::vector<std::string> failures_;
  int cases_ = 0;
};

}  // namespace kiln::testing::sweep
