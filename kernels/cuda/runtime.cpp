// The CUDA runtime behind kernels/cuda/runtime.h (compiled when CUDA is on).
// Invariants:
//  - device_count() never throws: no driver, no device or an unusable CUDA is
//    0 GPUs, cached; availability() says which, and reports an unusable one once.
//  - Every call that waits for the device or copies device-to-host bumps the
//    sync counters first, so a test can prove a training step sync-free.
//  - Calls that take a device argument run on that device, and calls that take
//    a stream on the stream's device; both restore the caller's current device
//    afterwards.
//  - Out-of-memory is not an error here (raw_malloc / host_alloc_pinned return
//    nullptr and clear the error); every other failure throws via KILN_CUDA_CHECK.
//  - A thread that never chose a device (a data-loader worker, the NCCL
//    watchdog) takes the device the process chose with set_device before its
//    first CUDA call, instead of the CUDA default 0 (see adopt_process_device).
#include "kernels/cuda/runtime.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/graph.h"
#include "kernels/error.h"

namespace kiln::cuda {

namespace {

std::atomic<uint64_t> device_to_host_copies{0};
std::atomic<uint64_t> synchronizations{0};

// The device last chosen with set_device by any thread; -1 before the first.
std::atomic<int> process_device{-1};
// Whether this thread chose its device or already adopted process_device.
thread_local bool thread_has_device = false;

// A new thread starts on device 0, and its first CUDA call (cudaHostAlloc for
// a pinned batch, cudaPointerGetAttributes, an event query) creates device 0's
// primary context: a few hundred MB on GPU 0 for every rank of a job whose
// ranks use cuda:1, cuda:2, ... (and a DeviceGuard restoring 0 would create
// it too). Such a thread takes the process's device instead, once.
// Until the process chooses (set_device), a thread stays undecided: a call
// made before that (building the data set, say) must not pin it to device 0.
void adopt_process_device() {
  if (thread_has_device) return;
  const int device = process_device.load(std::memory_order_relaxed);
  if (device < 0) return;
  thread_has_device = true;
  if (device > 0 && cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
}

// Whether this process has pinned any host memory: until it has, no pointer
// can be pinned memory of kiln's, and is_pinned answers without a CUDA call
// (cudaPointerGetAttributes creates the current device's context: GPU 0's on
// every rank whose data set is read before set_device).
std::atomic<bool> pinned_memory_used{false};

void check_device(int device, const char* what) {
  const int count = device_count();
  KILN_CHECK(device >= 0 && device < count, what, ": device cuda:", device,
             " does not exist (", count, " CUDA device", count == 1 ? "" : "s", " visible)");
}

// The default stream of each device: one non-blocking stream created on first
// use and kept for the life of the process (destroying it at exit could run
// after the driver has shut down).
struct DefaultStreams {
  std::mutex mutex;
  std::vector<Stream> streams;
};
DefaultStreams& default_streams() {
  static DefaultStreams* instance = new DefaultStreams();  // never destroyed, see above
  return *instance;
}

Stream default_stream(int device) {
  DefaultStreams& defaults = default_streams();
  std::lock_guard<std::mutex> lock(defaults.mutex);
  if (defaults.streams.empty()) defaults.streams.assign(static_cast<size_t>(device_count()), nullptr);
  Stream& stream = defaults.streams[static_cast<size_t>(device)];
  if (stream == nullptr) stream = create_stream(device);
  return stream;
}

// Per-thread override of the current stream; `set` distinguishes "the legacy
// default stream (nullptr) was chosen" from "nothing was chosen".
struct CurrentStream {
  Stream stream = nullptr;
  bool set = false;
};
thread_local std::vector<CurrentStream> current_streams;

struct PropertiesCache {
  std::mutex mutex;
  std::vector<std::unique_ptr<DeviceProperties>> properties;
  std::vector<size_t> total_memory;
};
PropertiesCache& properties_cache() {
  static PropertiesCache* instance = new PropertiesCache();
  return *instance;
}

cudaMemcpyKind to_cuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::host_to_device: return cudaMemcpyHostToDevice;
    case CopyKind::device_to_host: return cudaMemcpyDeviceToHost;
    case CopyKind::device_to_device: return cudaMemcpyDeviceToDevice;
    case CopyKind::host_to_host: return cudaMemcpyHostToHost;
  }
  KILN_THROW("internal error (a bug in kiln): unknown CopyKind ", static_cast<int>(kind));
}

cudaStream_t as_stream(Stream stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t as_event(Event event) { return static_cast<cudaEvent_t>(event); }

// The device of each stream create_stream made. cudaStreamGetDevice is refused
// while a stream captures (cudaErrorStreamCaptureUnsupported, seen on the H200
// with CUDA 13: a captured memset failed the whole graph), so kiln answers from
// its own record and asks CUDA only about a stream it did not create.
struct StreamDevices {
  std::mutex mutex;
  std::unordered_map<Stream, int> device_of;
};
StreamDevices& stream_devices() {
  static StreamDevices* instance = new StreamDevices();  // streams outlive static destruction (default_streams)
  return *instance;
}

// The device a stream belongs to (the current one for the legacy default
// stream): copies, memsets and event records on it run with it current.
int device_of(Stream stream) {
  adopt_process_device();
  int device = 0;
  if (stream == nullptr) {
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    return device;
  }
  {
    StreamDevices& streams = stream_devices();
    std::lock_guard<std::mutex> lock(streams.mutex);
    const auto it = streams.device_of.find(stream);
    if (it != streams.device_of.end()) return it->second;
  }
  KILN_CUDA_CHECK(cudaStreamGetDevice(as_stream(stream), &device));
  return device;
}

}  // namespace

DeviceGuard::DeviceGuard(int device, const char* what) {
  check_device(device, what);
  adopt_process_device();  // so that the destructor restores that device, not 0
  KILN_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) KILN_CUDA_CHECK(cudaSetDevice(device));
  device_ = device;
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; failing to switch back leaves the device
  // current, which the next kiln call sets explicitly anyway.
  if (previous_ != device_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

const Availability& availability() {
  static const Availability answer = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    (void)cudaGetLastError();  // not sticky; later launch checks must not see it
    int driver_version = 0, runtime_version = 0;
    (void)cudaDriverGetVersion(&driver_version);  // 0 when no driver is installed
    (void)cudaRuntimeGetVersion(&runtime_version);
    const DeviceCountAnswer kind = status == cudaSuccess                    ? DeviceCountAnswer::success
                                   : status == cudaErrorNoDevice            ? DeviceCountAnswer::no_device
                                   : status == cudaErrorInsufficientDriver ? DeviceCountAnswer::insufficient_driver
                                                                            : DeviceCountAnswer::other_error;
    Availability result = describe_availability(kind, count, cudaGetErrorName(status), cudaGetErrorString(status),
                                                driver_version, runtime_version);
    // Said once, where a GPU machine's problem would otherwise read as "no GPU".
    if (result.unusable) std::fprintf(stderr, "kiln: CUDA is unusable: %s\n", result.problem.c_str());
    return result;
  }();
  return answer;
}

int device_count() { return availability().device_count; }

DeviceScope::DeviceScope(int device, const char* what) : guard_(device, what), stream(current_stream(device)) {}

bool compiled_with_cuda() { return true; }

void set_device(int device) {
  check_device(device, "set_device");
  KILN_CUDA_CHECK(cudaSetDevice(device));
  thread_has_device = true;
  process_device.store(device, std::memory_order_relaxed);
}

int current_device() {
  if (device_count() == 0) return 0;
  adopt_process_device();
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void* raw_malloc(size_t bytes, int device) {
  DeviceGuard guard(device, "cudaMalloc");
  // The caching allocator's memory for a graph outlives it (graph.h).
  std::optional<RelaxedCapture> relaxed;
  if (capturing()) relaxed.emplace();
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it so later launch checks do not see it
    return nullptr;
  }
  KILN_CUDA_CHECK(status);
  return pointer;
}

void raw_free(void* pointer, int device) {
  if (pointer == nullptr) return;
  check_not_capturing("cudaFree");  // it synchronizes the device
  DeviceGuard guard(device, "cudaFree");
  KILN_CUDA_CHECK(cudaFree(pointer));
}

size_t device_total_memory(int device) {
  check_device(device, "device_total_memory");
  PropertiesCache& cache = properties_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (static_cast<size_t>(device) < cache.total_memory.size() && cache.total_memory[static_cast<size_t>(device)] != 0)
      return cache.total_memory[static_cast<size_t>(device)];
  }
  (void)device_properties(device);  // fills total_memory
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.total_memory[static_cast<size_t>(device)];
}

void* host_alloc_pinned(size_t bytes) {
  KILN_CHECK(device_count() > 0, "pinned memory: no CUDA device is available");
  adopt_process_device();
  pinned_memory_used.store(true, std::memory_order_relaxed);
  void* pointer = nullptr;
  // Portable: pinned for every device's context, so any GPU can copy from it.
  const cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  KILN_CUDA_CHECK(status);
  return pointer;
}

void host_free_pinned(void* pointer) {
  if (pointer == nullptr) return;
  adopt_process_device();
  KILN_CUDA_CHECK(cudaFreeHost(pointer));
}

namespace {
// What CUDA knows of `pointer` (cudaMemoryTypeUnregistered, as CUDA says of
// ordinary host memory, when it knows nothing); the error, if any, is cleared.
cudaPointerAttributes pointer_attributes(const void* pointer) {
  adopt_process_device();
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    attributes = cudaPointerAttributes{};
    attributes.type = cudaMemoryTypeUnregistered;
  }
  return attributes;
}
}  // namespace

bool is_pinned(const void* pointer) {
  if (pointer == nullptr || !pinned_memory_used.load(std::memory_order_relaxed) || device_count() == 0) return false;
  return pointer_attributes(pointer).type == cudaMemoryTypeHost;
}

int pointer_device(const void* pointer) {
  if (pointer == nullptr || device_count() == 0) return -1;
  const cudaPointerAttributes attributes = pointer_attributes(pointer);
  const bool on_device = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
  return on_device ? attributes.device : -1;
}

void memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) {
  // A copy to the host is recorded fine, but whoever reads the host buffer
  // reads it when the graph runs, not when it is captured: refused. A copy
  // from the host would read the host buffer again at every replay, long
  // after its owner let it go (a pageable one synchronizes besides): refused.
  if (kind == CopyKind::device_to_host) check_not_capturing("a device-to-host copy");
  if (kind == CopyKind::host_to_device) check_not_capturing("a host-to-device copy");
  if (kind == CopyKind::device_to_host) device_to_host_copies.fetch_add(1, std::memory_order_relaxed);
  if (bytes == 0) return;
  DeviceGuard guard(device_of(stream), "memcpy_async");
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), as_stream(stream)));
}

void memcpy_2d_device_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                            size_t height, Stream stream) {
  if (width == 0 || height == 0) return;
  DeviceGuard guard(device_of(stream), "memcpy_2d_device_async");
  KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice,
                                    as_stream(stream)));
}

void memset_async(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  DeviceGuard guard(device_of(stream), "memset_async");
  KILN_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
}

Stream current_stream(int device) {
  check_device(device, "current_stream");
  const auto index = static_cast<size_t>(device);
  if (index < current_streams.size() && current_streams[index].set) return current_streams[index].stream;
  return default_stream(device);
}

void set_current_stream(int device, Stream stream) {
  check_device(device, "set_current_stream");
  const auto index = static_cast<size_t>(device);
  if (current_streams.size() <= index) current_streams.resize(index + 1);
  current_streams[index] = CurrentStream{stream, true};
}

Stream create_stream(int device) {
  DeviceGuard guard(device, "create_stream");
  cudaStream_t stream = nullptr;
  // Non-blocking: kiln's streams never serialize with the legacy default stream.
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  StreamDevices& streams = stream_devices();
  std::lock_guard<std::mutex> lock(streams.mutex);
  streams.device_of[stream] = device;
  return stream;
}

void destroy_stream(Stream stream) {
  if (stream == nullptr) return;
  {
    StreamDevices& streams = stream_devices();
    std::lock_guard<std::mutex> lock(streams.mutex);
    streams.device_of.erase(stream);
  }
  KILN_CUDA_CHECK(cudaStreamDestroy(as_stream(stream)));
}

void stream_synchronize(Stream stream) {
  check_not_capturing("stream_synchronize");
  adopt_process_device();
  synchronizations.fetch_add(1, std::memory_order_relaxed);
  KILN_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void device_synchronize(int device) {
  check_not_capturing("device_synchronize");
  DeviceGuard guard(device, "device_synchronize");
  synchronizations.fetch_add(1, std::memory_order_relaxed);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
}

void profiler_start() { KILN_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { KILN_CUDA_CHECK(cudaProfilerStop()); }

Event create_event(int device, bool timing) {
  DeviceGuard guard(device, "create_event");
  cudaEvent_t event = nullptr;
  // Events without timing are cheaper to record and to wait on.
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming));
  return event;
}

void destroy_event(Event event) {
  if (event == nullptr) return;
  KILN_CUDA_CHECK(cudaEventDestroy(as_event(event)));
}

void record_event(Event event, Stream stream) {
  DeviceGuard guard(device_of(stream), "record_event");
  KILN_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream)));
}

void stream_wait_event(Stream stream, Event event) {
  DeviceGuard guard(device_of(stream), "stream_wait_event");
  KILN_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

void event_synchronize(Event event) {
  check_not_capturing("event_synchronize");
  adopt_process_device();
  synchronizations.fetch_add(1, std::memory_order_relaxed);
  KILN_CUDA_CHECK(cudaEventSynchronize(as_event(event)));
}

bool event_query(Event event) {
  adopt_process_device();
  const cudaError_t status = cudaEventQuery(as_event(event));
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error
    return false;
  }
  KILN_CUDA_CHECK(status);
  return true;
}

float event_elapsed_ms(Event start, Event end) {
  float milliseconds = 0.0f;
  KILN_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, as_event(start), as_event(end)));
  return milliseconds;
}

void launch_host_function(Stream stream, void (*function)(void*), void* data) {
  DeviceGuard guard(device_of(stream), "launch_host_function");
  KILN_CUDA_CHECK(cudaLaunchHostFunc(as_stream(stream), function, data));
}

SyncCounters sync_counters() {
  SyncCounters counters;
  counters.device_to_host_copies = device_to_host_copies.load(std::memory_order_relaxed);
  counters.synchronizations = synchronizations.load(std::memory_order_relaxed);
  return counters;
}

DeviceProperties device_properties(int device) {
  check_device(device, "device_properties");
  PropertiesCache& cache = properties_cache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  const auto index = static_cast<size_t>(device);
  if (cache.properties.size() <= index) {
    cache.properties.resize(index + 1);
    cache.total_memory.resize(index + 1, 0);
  }
  if (!cache.properties[index]) {
    cudaDeviceProp prop{};
    KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    auto properties = std::make_unique<DeviceProperties>();
    std::memset(properties.get(), 0, sizeof(DeviceProperties));
    static_assert(sizeof(properties->name) == sizeof(prop.name));
    std::memcpy(properties->name, prop.name, sizeof(properties->name));
    properties->name[sizeof(properties->name) - 1] = '\0';
    properties->multiprocessor_count = prop.multiProcessorCount;
    properties->l2_cache_bytes = static_cast<size_t>(prop.l2CacheSize);
    properties->shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
    properties->major = prop.major;
    properties->minor = prop.minor;
    cache.properties[index] = std::move(properties);
    cache.total_memory[index] = prop.totalGlobalMem;
  }
  return *cache.properties[index];
}

void check_last_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) [[unlikely]] {
    KILN_THROW("CUDA kernel launch failed: ", what, ": ", cudaGetErrorString(status), " (",
               cudaGetErrorName(status), ")");
  }
}

}  // namespace kiln::cuda
