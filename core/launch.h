// What core/, nn/ and optim/ hold while they queue CUDA work for tensors: the
// tensors' device made current and its current stream (cuda::DeviceScope).
// Written as `launch_on(x, "op").stream` in the launch's argument list, the
// temporary keeps the device current until the launch returns (a temporary
// lives to the end of its full expression); name a scope where several
// launches share it.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/error.h"

namespace kiln {

inline cuda::DeviceScope launch_on(Device device, const char* what) {
  KILN_ASSERT(device.is_cuda(), what, ": a CUDA launch for a tensor on ", device);
  return cuda::DeviceScope(device.index, what);
}
inline cuda::DeviceScope launch_on(const Tensor& tensor, const char* what) { return launch_on(tensor.device(), what); }

}  // namespace kiln
