// Thin wrappers over the CUDA runtime. Everything in kiln that copies between
// host and device or waits for the device goes through these, so the counters
// below prove a training step sync-free. With CUDA off (cuda/stub_runtime.cpp) device_count()
// is 0 and every other call throws kiln::Error.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::cuda {

using Stream = void*;  // cudaStream_t; nullptr is the legacy default stream
using Event = void*;   // cudaEvent_t

// Number of usable GPUs; 0 when CUDA is off, there is no driver, or no device.
int device_count();
inline bool is_available() { return device_count() > 0; }
bool compiled_with_cuda();

void set_device(int device);
int current_device();

// Makes `device` current for the guard's lifetime and restores the caller's
// device afterwards (no CUDA call when it already is current). Throws
// kiln::Error naming `what` when the device does not exist.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, const char* what = "DeviceGuard");
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int device_ = 0;
};

// Raw device memory. raw_malloc returns nullptr when the device is out of memory
// (the caching allocator then frees its cache and retries); other failures throw.
void* raw_malloc(size_t bytes, int device);
void raw_free(void* pointer, int device);
size_t device_total_memory(int device);

// Page-locked host memory (returns nullptr when none is left).
void* host_alloc_pinned(size_t bytes);
void host_free_pinned(void* pointer);
bool is_pinned(const void* pointer);

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };
// Asynchronous on `stream`; host memory must be pinned for the copy to overlap.
void memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream);
void memset_async(void* dst, int value, size_t bytes, Stream stream);

// The stream kiln launches work on for `device` (a per-thread current stream,
// by default one non-blocking stream per device created on first use).
Stream current_stream(int device);
void set_current_stream(int device, Stream stream);
Stream create_stream(int device);
void destroy_stream(Stream stream);
void stream_synchronize(Stream stream);
void device_synchronize(int device);

Event create_event(bool timing = false);
void destroy_event(Event event);
void record_event(Event event, Stream stream);
void stream_wait_event(Stream stream, Event event);
void event_synchronize(Event event);
bool event_query(Event event);
float event_elapsed_ms(Event start, Event end);

// Counters of host-visible synchronization: device-to-host copies and every
// kind of synchronize above. A sync-free step leaves both unchanged.
struct SyncCounters {
  uint64_t device_to_host_copies = 0;
  uint64_t synchronizations = 0;
};
SyncCounters sync_counters();

// Properties read at run time, never hard-coded.
struct DeviceProperties {
  char name[256];
  int multiprocessor_count;
  size_t l2_cache_bytes;
  size_t shared_memory_per_block_optin;
  int major;
  int minor;
};
DeviceProperties device_properties(int device);

// Throws kiln::Error naming `what` and the launch error if the last kernel
// launch failed. Every launch is followed by this.
void check_last_launch(const char* what);

}  // namespace kiln::cuda
