// describe_availability (kernels/cuda/runtime.h): compiled with and without
// CUDA, so that its cases are tested on machines without a GPU.
#include <sstream>

#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

namespace {
std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}
}  // namespace

Availability describe_availability(DeviceCountAnswer answer, int count, std::string_view error_name,
                                   std::string_view error_text, int driver_version, int runtime_version) {
  Availability result;
  std::ostringstream problem;
  const auto error = [&] { problem << " (" << error_name << ": " << error_text << ")"; };
  switch (answer) {
    case DeviceCountAnswer::success:
      result.device_count = count;
      if (count == 0) problem << "cudaGetDeviceCount found no CUDA device";
      break;
    case DeviceCountAnswer::no_device:
      problem << "no CUDA device is visible";
      error();
      break;
    case DeviceCountAnswer::insufficient_driver:
      if (driver_version == 0) {
        problem << "no NVIDIA driver is installed (libcuda.so.1 not found)";
        error();
      } else {
        result.unusable = true;
        problem << "the NVIDIA driver supports CUDA " << version_text(driver_version)
                << ", older than kiln's CUDA runtime " << version_text(runtime_version);
        error();
      }
      break;
    case DeviceCountAnswer::other_error:
      result.unusable = true;
      problem << "cudaGetDeviceCount failed";
      error();
      problem << "; driver CUDA " << (driver_version == 0 ? std::string("none") : version_text(driver_version))
              << ", runtime CUDA " << version_text(runtime_version);
      break;
  }
  result.problem = problem.str();
  return result;
}

}  // namespace kiln::cuda
