// Process helpers for the distributed tests (test_distributed*.cpp,
// test_trainer_ddp.cpp, test_zero.cpp): spawn this test binary or kiln-run
// with extra environment, wait with a deadline, read the workers' result
// files, and the checks a worker makes.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kernels/error.h"

namespace kiln::testing::dist {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/kiln_dist_XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

inline std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A port that was free a moment ago (for the case where rank 0 hosts the store).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return ntohs(address.sin_port);
}

// This test binary running only the skipped test case `entry`.
inline std::vector<std::string> worker_command(const std::string& entry = "distributed_worker_entry") {
  return {self_exe(), "--test-case=" + entry, "--no-skip=true", "--no-version=true", "--no-intro=true",
          "--minimal=true"};
}

// Forks and execs `argv` with the current environment plus `env`; output to `log`.
inline pid_t spawn(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
            const fs::path& log) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) merged[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [k, v] : env) merged[k] = v;
  std::vector<std::string> env_text;
  for (const auto& [k, v] : merged) env_text.push_back(k + "=" + v);
  std::vector<char*> envp, args;  // built before fork: the child only execs
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  const std::string log_path = log.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Waits for `pids` until `deadline_s`; kills the rest then. Returns the statuses (-1: killed at the deadline).
inline std::vector<int> wait_all(const std::vector<pid_t>& pids, double deadline_s) {
  std::vector<int> statuses(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  const auto deadline = Clock::now() + std::chrono::duration<double>(deadline_s);
  size_t remaining = pids.size();
  while (remaining > 0 && Clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        statuses[i] = status;
        done[i] = true;
        --remaining;
      }
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (done[i]) continue;
    ::kill(pids[i], SIGKILL);
    ::waitpid(pids[i], nullptr, 0);
  }
  return statuses;
}

// The numbers among the whitespace-separated words of `text`, in order
// (other words are skipped).
inline std::vector<double> parse_numbers(const std::string& text) {
  std::istringstream in(text);
  std::vector<double> values;
  for (std::string word; in >> word;) {
    char* end = nullptr;
    const double v = std::strtod(word.c_str(), &end);
    if (end != word.c_str() && *end == '\0') values.push_back(v);
  }
  return values;
}

// "key value..." lines -> key -> rest of the line.
inline std::map<std::string, std::string> fields(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t space = line.find(' ');
    out[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return out;
}

// A worker's check: a failure throws (the worker exits non-zero with the message).
#define WORKER_EXPECT(cond, ...) KILN_CHECK(cond, "worker check failed: " #cond " ", ##__VA_ARGS__)

// In a worker: `fn` throws kiln::Error with `words` in its message.
inline void expect_throw(const std::function<void()>& fn, const std::string& words) {
  try {
    fn();
  } catch (const Error& e) {
    WORKER_EXPECT(std::string(e.what()).find(words) != std::string::npos, "message '", e.what(), "' lacks '", words,
                  "'");
    return;
  }
  KILN_THROW("worker check failed: expected an error containing '", words, "'");
}

}  // namespace kiln::testing::dist
