#include "tests/support/python_checks.h"

#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "tests/support/test_util.h"

namespace kiln::testing {

std::string python_with(const std::string& imports, const char* env_var) {
  std::vector<std::string> candidates;
  if (const char* configured = std::getenv(env_var); configured != nullptr && *configured != '\0') {
    candidates.emplace_back(configured);
  }
  const std::filesystem::path venv_python = source_root() / ".venv" / "bin" / "python";
  if (std::filesystem::exists(venv_python)) candidates.push_back(venv_python.string());
  candidates.emplace_back("python3");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& python : candidates) {
    const std::string probe = python + " -c 'import " + imports + "' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return python;
  }
  return "";
}

bool python_checks_required() {
  const char* required = std::getenv("KILN_REQUIRE_PYTHON_CHECKS");
  return required != nullptr && std::string(required) == "1";
}

std::string require_python(const std::string& imports, const char* env_var, const std::string& what) {
  std::string python = python_with(imports, env_var);
  if (!python.empty()) return python;
  const std::string why = "no Python here imports " + imports + " (bash scripts/setup.sh --tests makes " +
                          (source_root() / ".venv").string() + " with them, or set " + env_var + ")";
  if (python_checks_required()) FAIL("KILN_REQUIRE_PYTHON_CHECKS=1 and " << why << ": " << what << " cannot run");
  MESSAGE("SKIPPED (" << why << "): " << what << " was not run");
  return "";
}


}  // namespace kiln::testing
