// What the GPU kit relies on: a GPU case is marked in its name, and CUDA that
// fails on a machine with a driver is an error, not "no GPU".
#include <doctest/doctest.h>

#include "kernels/cuda/runtime.h"
#include "tests/support/test_util.h"

using namespace kiln;
using cuda::DeviceCountAnswer;

TEST_CASE("availability: no driver or no device is no GPU; a failing driver is unusable") {
  const cuda::Availability none = cuda::describe_availability(
      DeviceCountAnswer::insufficient_driver, 0, "cudaErrorInsufficientDriver",
      "CUDA driver version is insufficient for CUDA runtime version", /*driver=*/0, /*runtime=*/13000);
  CHECK(none.device_count == 0);
  CHECK_FALSE(none.unusable);
  CHECK(none.problem.find("no NVIDIA driver is installed") != std::string::npos);
  CHECK(none.problem.find("cudaErrorInsufficientDriver") != std::string::npos);

  const cuda::Availability old_driver = cuda::describe_availability(
      DeviceCountAnswer::insufficient_driver, 0, "cudaErrorInsufficientDriver", "insufficient", 12040, 13000);
  CHECK(old_driver.unusable);
  CHECK(old_driver.problem.find("supports CUDA 12.4, older than kiln's CUDA runtime 13.0") != std::string::npos);

  const cuda::Availability no_device =
      cuda::describe_availability(DeviceCountAnswer::no_device, 0, "cudaErrorNoDevice", "no CUDA-capable device", 13000, 13000);
  CHECK_FALSE(no_device.unusable);
  CHECK(no_device.problem.find("cudaErrorNoDevice") != std::string::npos);

  const cuda::Availability broken = cuda::describe_availability(
      DeviceCountAnswer::other_error, 0, "cudaErrorSystemDriverMismatch", "system has unsupported display driver", 13000, 13000);
  CHECK(broken.unusable);
  CHECK(broken.device_count == 0);
  CHECK(broken.problem.find("cudaGetDeviceCount failed (cudaErrorSystemDriverMismatch") != std::string::npos);

  const cuda::Availability two = cuda::describe_availability(DeviceCountAnswer::success, 2, "cudaSuccess", "no error", 13000, 13000);
  CHECK(two.device_count == 2);
  CHECK_FALSE(two.unusable);
  CHECK(two.problem.empty());
}

TEST_CASE("availability: this machine's answer agrees with device_count and says why there is no GPU") {
  const cuda::Availability& here = cuda::availability();
  CHECK(here.device_count == cuda::device_count());
  CHECK(cuda::is_available() == (here.device_count > 0));
  if (here.device_count == 0) {
    MESSAGE("no GPU here: " << here.problem);
    CHECK_FALSE(here.problem.empty());
  }
}

// Each of these passes only when KILN_REQUIRE_GPU(S) fails the case: a GPU case
// without its marker would be invisible to the kit, which selects by name.
TEST_CASE("test support: a case that calls KILN_REQUIRE_GPU without the marker fails" * doctest::should_fail()) {
  KILN_REQUIRE_GPU();
}

TEST_CASE("test support: KILN_REQUIRE_GPUS(2) fails a case marked for one GPU [gpu]" * doctest::should_fail()) {
  KILN_REQUIRE_GPUS(2);
}
