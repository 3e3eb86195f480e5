// Linked when kiln is built without a CUDA toolkit: no device, and every call
// that needs one throws kiln::Error.
#include "kernels/copy.h"
#include "kernels/cuda/runtime.h"
#include "kernels/error.h"

namespace kiln::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

const Availability& availability() {
  static const Availability answer{0, false, "kiln was built without CUDA (no CUDA toolkit was found at configure time)"};
  return answer;
}
int device_count() { return 0; }
bool compiled_with_cuda() { return false; }
void set_device(int) { no_cuda("set_device"); }
int current_device() { return 0; }
DeviceGuard::DeviceGuard(int, const char* what) { no_cuda(what); }
DeviceGuard::~DeviceGuard() = default;
void* raw_malloc(size_t, int) { no_cuda("cudaMalloc"); }
void raw_free(void*, int) { no_cuda("cudaFree"); }
size_t device_total_memory(int) { no_cuda("device_total_memory"); }
void* host_alloc_pinned(size_t) { no_cuda("pinned memory"); }
void host_free_pinned(void*) { no_cuda("pinned memory"); }
bool is_pinned(const void*) { return false; }
int pointer_device(const void*) { return -1; }
void memcpy_async(void*, const void*, size_t, CopyKind, Stream) { no_cuda("memcpy_async"); }
void memset_async(void*, int, size_t, Stream) { no_cuda("memset_async"); }
void memcpy_2d_device_async(void*, size_t, const void*, size_t, size_t, size_t, Stream) {
  no_cuda("memcpy_2d_device_async");
}
Stream current_stream(int) { return nullptr; }
void set_current_stream(int, Stream) { no_cuda("set_current_stream"); }
Stream create_stream(int) { no_cuda("create_stream"); }
void destroy_stream(Stream) {}
void stream_synchronize(Stream) { no_cuda("stream_synchronize"); }
void device_synchronize(int) { no_cuda("device_synchronize"); }
void profiler_start() { no_cuda("profiler_start"); }
void profiler_stop() { no_cuda("profiler_stop"); }
DeviceScope::DeviceScope(int device, const char* what) : guard_(device, what), stream(nullptr) {}
Event create_event(int, bool) { no_cuda("create_event"); }
void launch_host_function(Stream, void (*)(void*), void*) { no_cuda("launch_host_function"); }
void destroy_event(Event) {}
void record_event(Event, Stream) { no_cuda("record_event"); }
void stream_wait_event(Stream, Event) { no_cuda("stream_wait_event"); }
void event_synchronize(Event) { no_cuda("event_synchronize"); }
bool event_query(Event) { no_cuda("event_query"); }
float event_elapsed_ms(Event, Event) { no_cuda("event_elapsed_ms"); }
SyncCounters sync_counters() { return {}; }
DeviceProperties device_properties(int) { no_cuda("device_properties"); }
void check_last_launch(const char*) {}

}  // namespace kiln::cuda

namespace kiln::kernels {
void copy_cuda(const IterShape&, const Operand&, const Operand&, cuda::Stream) {
  KILN_THROW("copy: kiln was built without CUDA");
}
void fill_cuda(void*, DType, int64_t, double, cuda::Stream) { KILN_THROW("fill: kiln was built without CUDA"); }
}  // namespace kiln::kernels
