#include "tests/support/run_binary.h"

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>

namespace kiln::testing {

namespace fs = std::filesystem;

std::string built_binary(const std::string& name) {
  const fs::path binary = fs::read_symlink("/proc/self/exe").parent_path() / name;
  REQUIRE_MESSAGE(fs::exists(binary), name << " is not built next to kiln_tests: " << binary.string());
  return binary.string();
}

BinaryRun run_shell(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  BinaryRun run;
  std::array<char, 4096> buffer;
  while (size_t count = std::fread(buffer.data(), 1, buffer.size(), pipe)) run.output.append(buffer.data(), count);
  const int status = ::pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

BinaryRun run_built_binary(const std::string& name, const std::string& arguments, const std::string& prefix) {
  return run_shell("OMP_WAIT_POLICY=passive " + prefix + built_binary(name) + " " + arguments);
}

}  // namespace kiln::testing
