// libkiln_kernel_trace.so: every kernel, memcpy and memset that one GPU step
// runs, with its device start and end, for kiln and PyTorch alike, without
// changing either program and without ncu's kernel-by-kernel serialization.
//
//   CUDA_INJECTION64_PATH=build/bin/libkiln_kernel_trace.so KILN_KERNEL_TRACE=kiln.csv
//     build/bin/bench_transformer --accelerator gpu --profile-step ...   (one command line)
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when it
// initializes and calls InitializeInjection (CUPTI's trace-injection
// mechanism, as NVIDIA's cupti_trace_injection sample). The library loads
// CUPTI 13 with dlopen (so nothing links it), records the device activity
// through CUPTI's activity API, and subscribes to two runtime calls only:
// cudaProfilerStart opens the window and cudaProfilerStop closes it and writes
// to KILN_KERNEL_TRACE the activity that started inside it (the step that
// bench_transformer, bench_fashion, torch_transformer.py and torch_fashion.py
// bracket with --profile-step; both synchronize the device on each side):
//   # kiln_kernel_trace window_ns <start> <end> dropped <records>
//   start_ns,end_ns,name
// Kernels keep their concurrency (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), so
// the union of the intervals is the GPU's busy time and the rest of the window
// its idle time: launch and host overhead. No other runtime call is traced, so
// the host runs at its usual speed. torch (kineto) touches CUPTI only while
// torch.profiler runs, which the peer scripts never start. bench/profile_step.py
// --tracer cupti runs both sides this way and prints where each step's time goes.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_runtime_cbid.h>
#include <cupti_version.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

// The CUPTI functions used, each resolved with dlsym under its own name into
// the member of that name (cupti.cuptiActivityEnable, ...).
#define KILN_CUPTI_FUNCTIONS(X)                                                                                  \
  X(cuptiActivityRegisterCallbacks) X(cuptiActivityEnable) X(cuptiActivityDisable) X(cuptiActivityFlushAll)      \
  X(cuptiActivityGetNextRecord) X(cuptiActivityGetNumDroppedRecords) X(cuptiActivitySetAttribute)                \
  X(cuptiGetResultString) X(cuptiSubscribe) X(cuptiEnableCallback) X(cuptiGetTimestamp) X(cuptiGetVersion)

struct Cupti {
#define KILN_CUPTI_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_CUPTI_FUNCTIONS(KILN_CUPTI_MEMBER)
#undef KILN_CUPTI_MEMBER
};

struct Activity {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string name;
};

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
Cupti cupti;
// Never destroyed: CUPTI may still hand over a buffer while the process runs its
// exit-time destructors, and must not find these gone.
std::mutex& mutex = *new std::mutex;
std::vector<Activity>& activities = *new std::vector<Activity>;  // guarded by mutex
uint64_t window_start = 0, window_end = 0, dropped = 0, untimed = 0;  // guarded by mutex
bool written = false;                                                 // guarded by mutex
const char* trace_path = nullptr;

void fail(const char* what, CUptiResult result) {
  const char* text = "unknown";
  if (cupti.cuptiGetResultString != nullptr) cupti.cuptiGetResultString(result, &text);
  std::fprintf(stderr, "kiln_kernel_trace: %s failed: %s\n", what, text);
}

std::string demangled(const char* name) {
  if (name == nullptr) return "[unnamed kernel]";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string result = status == 0 && plain != nullptr ? plain : name;
  std::free(plain);
  return result;
}

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  // CUPTI wants 8-byte-aligned buffers.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer != nullptr ? kBytes : 0;
  *max_records = 0;
}

// Newer CUPTI versions append fields to these records and keep the prefix that
// is read here (start, end, name, bytes, cbid).
void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid_bytes) {
  std::lock_guard<std::mutex> lock(mutex);
  CUpti_Activity* record = nullptr;
  while (!written && cupti.cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (kernel->start == 0 && kernel->end == 0) {  // CUPTI had no device memory left for its timestamps
          ++untimed;
          break;
        }
        activities.push_back({kernel->start, kernel->end, demangled(kernel->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        activities.push_back({copy->start, copy->end,
                              std::string("[memcpy ") + copy_kind(copy->copyKind) + " " +
                                  std::to_string(copy->bytes) + " bytes]"});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        activities.push_back({set->start, set->end, "[memset " + std::to_string(set->bytes) + " bytes]"});
        break;
      }
      default: break;
    }
  }
  size_t lost = 0;
  if (cupti.cuptiActivityGetNumDroppedRecords(context, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
  std::free(buffer);
}

// Once: at the cudaProfilerStop that closes the window (the device is idle, so
// every record of the step is complete), or at exit if that never came.
void write_trace() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (written) return;
  }
  // Not under the mutex: the flush hands the buffers to buffer_completed, on this thread.
  const CUptiResult result = cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (result != CUPTI_SUCCESS) fail("cuptiActivityFlushAll", result);
  for (CUpti_ActivityKind kind : kKinds) cupti.cuptiActivityDisable(kind);  // the rest of the run goes untraced
  std::lock_guard<std::mutex> lock(mutex);
  if (written) return;
  written = true;
  if (window_end == 0) {  // no file: a child process or a run without --profile-step must not
    std::fprintf(stderr, "kiln_kernel_trace: no cudaProfilerStart ... cudaProfilerStop seen (run with "
                         "--profile-step): %s not written\n", trace_path);
    return;
  }
  std::FILE* out = std::fopen(trace_path, "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kiln_kernel_trace: cannot write KILN_KERNEL_TRACE=%s: %s\n", trace_path,
                 std::strerror(errno));
    return;
  }
  std::fprintf(out, "# kiln_kernel_trace window_ns %llu %llu dropped %llu\nstart_ns,end_ns,name\n",
               static_cast<unsigned long long>(window_start), static_cast<unsigned long long>(window_end),
               static_cast<unsigned long long>(dropped + untimed));
  for (const Activity& activity : activities) {
    // By start only: a GPU end converted to the host clock may land a little past window_end.
    if (activity.start < window_start || activity.start >= window_end) continue;
    std::string quoted;  // CSV: the name in quotes, its quotes doubled (templates can hold none, but be safe)
    for (char c : activity.name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(out, "%llu,%llu,\"%s\"\n", static_cast<unsigned long long>(activity.start),
                 static_cast<unsigned long long>(activity.end), quoted.c_str());
  }
  std::fclose(out);
}

// cudaProfilerStart (on its exit) opens the window and cudaProfilerStop (on its
// entry) closes it, on CUPTI's clock, the clock of the activity records.
void CUPTIAPI on_runtime_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  uint64_t now = 0;
  if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && call->callbackSite == CUPTI_API_EXIT) {
    std::lock_guard<std::mutex> lock(mutex);
    if (window_start == 0 && cupti.cuptiGetTimestamp(&now) == CUPTI_SUCCESS) window_start = now;
  } else if (cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && call->callbackSite == CUPTI_API_ENTER) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (window_start == 0 || window_end != 0 || cupti.cuptiGetTimestamp(&now) != CUPTI_SUCCESS) return;
      window_end = now;
    }
    write_trace();
  }
}

template <typename Function>
bool resolve(void* library, const char* name, Function& function) {
  function = reinterpret_cast<Function>(dlsym(library, name));
  if (function == nullptr) std::fprintf(stderr, "kiln_kernel_trace: %s not found in libcupti\n", name);
  return function != nullptr;
}

}  // namespace

// Called by the CUDA driver at initialization; 1 on success.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  trace_path = std::getenv("KILN_KERNEL_TRACE");
  if (trace_path == nullptr || *trace_path == '\0') {
    std::fprintf(stderr, "kiln_kernel_trace: set KILN_KERNEL_TRACE to the CSV file to write\n");
    return 0;
  }
  // The soname first (LD_LIBRARY_PATH: the libcupti torch loads, if any), then the toolkit's folders.
  void* library = nullptr;
  for (const char* path : {"libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                           "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13"}) {
    if ((library = dlopen(path, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
  }
  if (library == nullptr) {
    std::fprintf(stderr, "kiln_kernel_trace: libcupti.so.13 not found (LD_LIBRARY_PATH, /usr/local/cuda): %s\n",
                 dlerror());
    return 0;
  }
  bool resolved = true;
#define KILN_CUPTI_RESOLVE(name) resolved = resolve(library, #name, cupti.name) && resolved;
  KILN_CUPTI_FUNCTIONS(KILN_CUPTI_RESOLVE)
#undef KILN_CUPTI_RESOLVE
  if (!resolved) return 0;
  // The records are read through CUPTI 13's structs: their leading fields
  // (start, end, name, bytes) keep their places within a major version.
  uint32_t version = 0;
  if (cupti.cuptiGetVersion(&version) != CUPTI_SUCCESS || version < 130000 || version >= 140000) {
    std::fprintf(stderr, "kiln_kernel_trace: the libcupti loaded has API version %u, not CUPTI 13 (130000-139999)\n",
                 version);
    return 0;
  }
  // A device buffer of 32 MiB per context: a warm-up plus a step of a few
  // thousand kernels fit between CUPTI's flushes.
  size_t device_buffer = 32 << 20, attribute_size = sizeof(device_buffer);
  cupti.cuptiActivitySetAttribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, &attribute_size, &device_buffer);
  // The one CUPTI subscriber (CUDA 13.0 allows one): torch subscribes only when torch.profiler runs.
  CUpti_SubscriberHandle subscriber = nullptr;
  CUptiResult result = cupti.cuptiSubscribe(&subscriber, on_runtime_api, nullptr);
  if (result != CUPTI_SUCCESS) {
    fail("cuptiSubscribe (another CUPTI tool attached?)", result);
    return 0;
  }
  for (CUpti_CallbackId cbid :
       {CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000, CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000}) {
    if ((result = cupti.cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, cbid)) != CUPTI_SUCCESS) {
      fail("cuptiEnableCallback", result);
      return 0;
    }
  }
  result = cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (result != CUPTI_SUCCESS) {
    fail("cuptiActivityRegisterCallbacks", result);
    return 0;
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if ((result = cupti.cuptiActivityEnable(kind)) != CUPTI_SUCCESS) {
      fail("cuptiActivityEnable", result);
      return 0;
    }
  }
  // At exit, only to say so when no window closed (a run without --profile-step,
  // or a child process that inherited the environment): no file is written then.
  std::atexit(write_trace);
  return 1;
}
