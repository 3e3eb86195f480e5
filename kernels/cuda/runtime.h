// Thin wrappers over the CUDA runtime. Everything in kiln that copies between
// host and device or waits for the device goes through these, so the counters
// below prove a training step sync-free. With CUDA off (cuda/stub_runtime.cpp) device_count()
// is 0 and every other call throws kiln::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::cuda {

using Stream = void*;  // cudaStream_t; nullptr is the legacy default stream
using Event = void*;   // cudaEvent_t

// Number of usable GPUs; 0 when CUDA is off, there is no driver, no device, or
// CUDA is unusable (see availability()). Never throws; cached.
int device_count();
inline bool is_available() { return device_count() > 0; }
bool compiled_with_cuda();

// Why device_count() is what it is. `problem` is empty when CUDA answered with
// devices; otherwise it says why there are none, naming the CUDA error
// (cudaGetErrorName). `unusable` tells an error apart from "no GPU here": a
// machine with an NVIDIA driver whose CUDA fails (a driver too old for this
// runtime, a broken device, ...) is unusable, and that is reported once on
// stderr; no driver installed, no device, or a build without CUDA is not.
struct Availability {
  int device_count = 0;
  bool unusable = false;
  std::string problem;
};
const Availability& availability();

// What cudaGetDeviceCount answered, for describe_availability.
enum class DeviceCountAnswer { success, no_device, insufficient_driver, other_error };
// The Availability for that answer (a pure function, so each case is tested
// without a GPU). Versions are CUDA's encoding (13000 = 13.0); a driver
// version of 0 means no driver is installed.
Availability describe_availability(DeviceCountAnswer answer, int count, std::string_view error_name,
                                   std::string_view error_text, int driver_version, int runtime_version);

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

// What an op holds while it queues work for tensors on `device`: that device
// is current for the scope (the thread's previous one comes back at its end)
// and `stream` is the device's current stream. Kernels launch on the current
// device, so without it a tensor on cuda:1 fails while cuda:0 is current.
class DeviceScope {
 public:
  explicit DeviceScope(int device, const char* what = "DeviceScope");

 private:
  DeviceGuard guard_;  // first: the stream is looked up with the device current

 public:
  const Stream stream;
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
// The device whose memory `pointer` points into (cudaMalloc'd or managed
// memory), or -1 for host memory, pinned or not, and for pointers CUDA does not
// know (always -1 without a GPU).
int pointer_device(const void* pointer);

enum class CopyKind { host_to_device, device_to_host, device_to_device, host_to_host };
// Asynchronous on `stream`; host memory must be pinned for the copy to overlap.
void memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream);
void memset_async(void* dst, int value, size_t bytes, Stream stream);
// `height` rows of `width` bytes, a pitch (bytes from one row's start to the
// next) apart at each end, device to device (cudaMemcpy2DAsync).
void memcpy_2d_device_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                            size_t height, Stream stream);

// The stream kiln launches work on for `device` (a per-thread current stream,
// by default one non-blocking stream per device created on first use).
Stream current_stream(int device);
void set_current_stream(int device, Stream stream);
Stream create_stream(int device);
void destroy_stream(Stream stream);
void stream_synchronize(Stream stream);
void device_synchronize(int device);
// cudaProfilerStart/Stop: brackets the work an external profiler started
// with --profile-from-start off (ncu, nsys) records, e.g. one training step.
void profiler_start();
void profiler_stop();

// An event of `device` (events belong to the device current at creation, and a
// record on a stream of another device fails).
Event create_event(int device, bool timing);
void destroy_event(Event event);
void record_event(Event event, Stream stream);
void stream_wait_event(Stream stream, Event event);
void event_synchronize(Event event);
bool event_query(Event event);
float event_elapsed_ms(Event start, Event end);

// Queues `function(data)` on `stream`: it runs on a driver thread once the
// work queued before it is done, and the stream waits for it to return (it
// must not call CUDA). Tests use it to hold a stream at a known point.
void launch_host_function(Stream stream, void (*function)(void*), void* data);

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
