// libkiln_kernel_trace.so: every kernel, memcpy and memset that one GPU step
// runs, with its device start and end, for kiln and PyTorch alike, without
// changing either program and without ncu's kernel-by-kernel serialization.
//
//   CUDA_INJECTION64_PATH=build/bin/libkiln_kernel_trace.so KILN_KERNEL_TRACE=kiln.csv
//     build/bin/bench_transformer --accelerator gpu --profile-step ...   (one command line)
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH when it
// initializes and calls InitializeInjection (CUPTI's trace-injection
// mechanism). The library loads CUPTI with dlopen (so nothing links it) and
// records, through CUPTI's activity API, the device activity and the runtime
// API calls; at exit it writes to KILN_KERNEL_TRACE the activity that ran
// between the program's cudaProfilerStart and cudaProfilerStop (the step that
// bench_transformer, bench_fashion, torch_transformer.py and torch_fashion.py
// bracket with --profile-step; both synchronize the device on each side):
//   # kiln_kernel_trace window_ns <start> <end> dropped <records>
//   start_ns,end_ns,name
// Kernels keep their concurrency (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), so
// the union of the intervals is the GPU's busy time and the rest of the window
// its idle time: launch and host overhead. Recording every runtime call costs
// the host well under a microsecond each. bench/profile_step.py --tracer cupti
// runs both sides this way and prints where each step's time goes.
#include <cupti_activity.h>
#include <cupti_runtime_cbid.h>
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

struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped_records = nullptr;
  decltype(&cuptiActivitySetAttribute) set_attribute = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

struct Activity {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string name;
};

Cupti cupti;
std::mutex mutex;
std::vector<Activity> activities;  // guarded by mutex
uint64_t window_start = 0, window_end = 0, dropped = 0;
const char* trace_path = nullptr;

void fail(const char* what, CUptiResult result) {
  const char* text = "unknown";
  if (cupti.result_string != nullptr) cupti.result_string(result, &text);
  std::fprintf(stderr, "kiln_kernel_trace: %s failed: %s\n", what, text);
}

std::string demangled(const char* name) {
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
  while (cupti.next_record(buffer, valid_bytes, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
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
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        const auto* call = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        // The window: from the end of the first cudaProfilerStart to the start
        // of the first cudaProfilerStop after it.
        if (call->cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 && window_start == 0) {
          window_start = call->end;
        } else if (call->cbid == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 && window_start != 0 &&
                   window_end == 0) {
          window_end = call->start;
        }
        break;
      }
      default: break;
    }
  }
  size_t lost = 0;
  if (cupti.dropped_records(context, stream, &lost) == CUPTI_SUCCESS) dropped += lost;
  std::free(buffer);
}

void write_trace() {
  const CUptiResult result = cupti.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (result != CUPTI_SUCCESS) fail("cuptiActivityFlushAll", result);
  std::lock_guard<std::mutex> lock(mutex);
  std::FILE* out = std::fopen(trace_path, "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kiln_kernel_trace: cannot write KILN_KERNEL_TRACE=%s: %s\n", trace_path,
                 std::strerror(errno));
    return;
  }
  std::fprintf(out, "# kiln_kernel_trace window_ns %llu %llu dropped %llu\nstart_ns,end_ns,name\n",
               static_cast<unsigned long long>(window_start), static_cast<unsigned long long>(window_end),
               static_cast<unsigned long long>(dropped));
  for (const Activity& activity : activities) {
    if (window_end == 0 || activity.start < window_start || activity.end > window_end) continue;
    std::string quoted;  // CSV: the name in quotes, its quotes doubled (templates can hold none, but be safe)
    for (char c : activity.name) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    std::fprintf(out, "%llu,%llu,\"%s\"\n", static_cast<unsigned long long>(activity.start),
                 static_cast<unsigned long long>(activity.end), quoted.c_str());
  }
  std::fclose(out);
  if (window_end == 0) {
    std::fprintf(stderr, "kiln_kernel_trace: no cudaProfilerStart ... cudaProfilerStop seen (run with --profile-step): "
                         "%s holds no activity\n", trace_path);
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
  for (const char* path : {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
                           "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13"}) {
    if ((library = dlopen(path, RTLD_NOW | RTLD_GLOBAL)) != nullptr) break;
  }
  if (library == nullptr) {
    std::fprintf(stderr, "kiln_kernel_trace: libcupti.so.13 not found (LD_LIBRARY_PATH, /usr/local/cuda): %s\n",
                 dlerror());
    return 0;
  }
  if (!resolve(library, "cuptiActivityRegisterCallbacks", cupti.register_callbacks) ||
      !resolve(library, "cuptiActivityEnable", cupti.enable) ||
      !resolve(library, "cuptiActivityFlushAll", cupti.flush_all) ||
      !resolve(library, "cuptiActivityGetNextRecord", cupti.next_record) ||
      !resolve(library, "cuptiActivityGetNumDroppedRecords", cupti.dropped_records) ||
      !resolve(library, "cuptiActivitySetAttribute", cupti.set_attribute) ||
      !resolve(library, "cuptiGetResultString", cupti.result_string)) {
    return 0;
  }
  // A device buffer of 32 MiB per context: a warm-up plus a step of a few
  // thousand kernels fit between CUPTI's flushes.
  size_t device_buffer = 32 << 20, attribute_size = sizeof(device_buffer);
  cupti.set_attribute(CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, &attribute_size, &device_buffer);
  CUptiResult result = cupti.register_callbacks(buffer_requested, buffer_completed);
  if (result != CUPTI_SUCCESS) {
    fail("cuptiActivityRegisterCallbacks", result);
    return 0;
  }
  for (CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                  CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME}) {
    if ((result = cupti.enable(kind)) != CUPTI_SUCCESS) {
      fail("cuptiActivityEnable", result);
      return 0;
    }
  }
  // Registered after the CUDA runtime's own exit handler (the runtime starts
  // before it initializes the driver), so it runs first, with the context alive.
  std::atexit(write_trace);
  return 1;
}
