// The Python side of the interop checks (tests/test_torch_interop.cpp,
// TensorBoard's reader in tests/test_tensorboard_logger.cpp): which Python
// runs them, and whether a missing one may skip the case.
#pragma once

#include <string>

#include "tests/support/run_binary.h"

namespace kiln::testing {

// The first of $env_var (when set and non-empty), <source root>/.venv/bin/python
// (the virtual environment `scripts/setup.sh --tests` makes), python3 and
// /usr/bin/python3 that imports every module in `imports` (a Python import
// list, e.g. "torch, safetensors.torch"); empty when none does.
std::string python_with(const std::string& imports, const char* env_var);

// Whether a case whose Python is missing must fail rather than skip:
// KILN_REQUIRE_PYTHON_CHECKS=1, which scripts/test.sh (so CI) sets, so a
// broken installation cannot turn the check into a silent skip.
bool python_checks_required();

// python_with(imports, env_var), or, when there is none: fails the case if
// python_checks_required(), else says "SKIPPED (...): <what> was not run"
// and returns "" (the caller then returns).
std::string require_python(const std::string& imports, const char* env_var, const std::string& what);

}  // namespace kiln::testing
