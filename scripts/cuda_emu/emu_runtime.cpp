// The kiln::cuda runtime pieces the emulated kernel files call, on host
// memory: launches are checked against emu::last_error, copies are memcpy,
// streams are ignored (every emulated launch has finished when it returns).
#include "emu_cuda.h"
#include "kernels/cuda/runtime.h"
#include "kernels/error.h"

namespace kiln::cuda {

void check_last_launch(const char* what) {
  if (!emu::last_error.empty()) {
    const std::string error = emu::last_error;
    emu::last_error.clear();
    throw Error(std::string(what) + ": " + error, __FILE__, __LINE__);
  }
}

DeviceGuard::DeviceGuard(int device, const char* what) {
  KILN_CHECK(device == 0, what, ": the emulation has one device, not ", device);
}
DeviceGuard::~DeviceGuard() = default;

void memcpy_async(void* dst, const void* src, size_t bytes, CopyKind, Stream) { std::memcpy(dst, src, bytes); }
void memset_async(void* dst, int value, size_t bytes, Stream) { std::memset(dst, value, bytes); }
void memcpy_2d_device_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                            size_t height, Stream) {
  for (size_t row = 0; row < height; ++row) {
    std::memcpy(static_cast<char*>(dst) + row * dst_pitch, static_cast<const char*>(src) + row * src_pitch, width);
  }
}
void stream_synchronize(Stream) {}

// One device shaped like an H100 SXM (132 multiprocessors; EMU_SM_COUNT=n for another
// count): plans that scale with the multiprocessor count (reduction.cu's chunking) then
// split work as they would on that GPU.
DeviceProperties device_properties(int device) {
  KILN_CHECK(device == 0, "device_properties: the emulation has one device, not ", device);
  DeviceProperties p{};
  std::snprintf(p.name, sizeof p.name, "kiln CUDA emulator (H100-like)");
  const char* sms = std::getenv("EMU_SM_COUNT");
  p.multiprocessor_count = sms != nullptr && *sms != 0 ? std::atoi(sms) : 132;
  p.l2_cache_bytes = size_t{50} << 20;
  p.shared_memory_per_block_optin = 227 * 1024;
  p.major = 9;
  p.minor = 0;
  return p;
}

}  // namespace kiln::cuda

extern "C" const char* cudaGetErrorString(cudaError_t) { return "(emulated)"; }
extern "C" const char* cudaGetErrorName(cudaError_t) { return "(emulated)"; }
// KILN_CUDA_CHECK clears the error state before it throws; emulated calls leave none.
extern "C" cudaError_t cudaGetLastError() { return cudaSuccess; }
