// Runs a program built next to kiln_tests (train_fashion, train_gan,
// kiln-run) through the shell and captures its output, for tests of the
// command-line binaries.
#pragma once

#include <string>

namespace kiln::testing {

struct BinaryRun {
  int exit_code = -1;  // -1 when the program did not exit normally
  std::string output;  // stdout and stderr together
};

// The path of `name` next to the running test binary; fails the test case
// when it is not built.
std::string built_binary(const std::string& name);

// Runs `command` through the shell, stderr merged into stdout.
BinaryRun run_shell(const std::string& command);

// Runs `prefix` + the built `name` + `arguments` with OMP_WAIT_POLICY=passive
// (OpenMP threads spinning between kernels would fight the test files CTest
// runs beside this one for the same cores). `prefix` may hold a launcher
// (e.g. "kiln-run --nproc-per-node 2 -- ").
BinaryRun run_built_binary(const std::string& name, const std::string& arguments, const std::string& prefix = "");

}  // namespace kiln::testing
