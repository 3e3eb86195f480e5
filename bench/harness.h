// A small kernel-benchmark harness shared by bench/bench_*.cpp.
//
// GPU timing: warm-up runs, then for every repeat the L2 cache is flushed by
// writing a buffer of twice its size (read from cudaGetDeviceProperties), and
// the op is timed alone between two CUDA events on kiln's current stream; the
// median of the repeats is reported. CPU timing does the same with a steady
// clock and a buffer of twice the last-level cache. Rows print as a table with
// GB/s (and TFLOP/s where the case counts FLOPs) and the percentage of a copy
// bandwidth measured in the same run, the practical ceiling of a memory-bound op.
//
//   kiln::bench::GpuTimer timer(0);
//   Measurement m = timer.time([&] { (void)relu(x); }, 50);
//   table.add({"relu", "[1<<26]", "float32", m, bytes, 0});
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/error.h"

namespace kiln::bench {

struct Measurement {
  double median_ms = 0;
  double min_ms = 0;
  int repeats = 0;
};

inline Measurement summarize(std::vector<double> times_ms) {
  Measurement m;
  m.repeats = static_cast<int>(times_ms.size());
  if (times_ms.empty()) return m;
  std::sort(times_ms.begin(), times_ms.end());
  const size_t n = times_ms.size();
  m.median_ms = n % 2 ? times_ms[n / 2] : 0.5 * (times_ms[n / 2 - 1] + times_ms[n / 2]);
  m.min_ms = times_ms.front();
  return m;
}

// Times work on kiln's current stream of `device` with CUDA events.
class GpuTimer {
 public:
  explicit GpuTimer(int device = 0) : device_(device) {
    const cuda::DeviceProperties properties = cuda::device_properties(device);
    flush_bytes_ = 2 * std::max<size_t>(properties.l2_cache_bytes, 1 << 20);
    flush_ = empty({static_cast<int64_t>(flush_bytes_)}, {.dtype = DType::u8, .device = Device::cuda(device)});
    start_ = cuda::create_event(device, /*timing=*/true);
    end_ = cuda::create_event(device, /*timing=*/true);
  }
  ~GpuTimer() {
    cuda::destroy_event(start_);
    cuda::destroy_event(end_);
  }
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  size_t flush_bytes() const { return flush_bytes_; }

  Measurement time(const std::function<void()>& fn, int repeats, int warmup = 3) {
    cuda::Stream stream = cuda::current_stream(device_);
    for (int i = 0; i < warmup; ++i) fn();
    cuda::stream_synchronize(stream);
    std::vector<double> times;
    times.reserve(static_cast<size_t>(repeats));
    for (int i = 0; i < repeats; ++i) {
      // A different byte each time so no layer can skip the write.
      cuda::memset_async(flush_.data_ptr(), i & 0xff, flush_bytes_, stream);
      cuda::record_event(start_, stream);
      fn();
      cuda::record_event(end_, stream);
      cuda::event_synchronize(end_);
      times.push_back(cuda::event_elapsed_ms(start_, end_));
    }
    return summarize(std::move(times));
  }

 private:
  int device_;
  size_t flush_bytes_ = 0;
  Tensor flush_;
  cuda::Event start_ = nullptr;
  cuda::Event end_ = nullptr;
};

// Times host work with a steady clock, flushing the last-level cache between repeats.
class CpuTimer {
 public:
  CpuTimer() {
    long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    if (llc <= 0) llc = 32L << 20;
    // Capped: some VMs report the whole host's cache.
    flush_bytes_ = std::min<size_t>(2 * static_cast<size_t>(llc), size_t{512} << 20);
    flush_.assign(flush_bytes_, 0);
  }
  size_t flush_bytes() const { return flush_bytes_; }

  Measurement time(const std::function<void()>& fn, int repeats, int warmup = 1) {
    for (int i = 0; i < warmup; ++i) fn();
    std::vector<double> times;
    times.reserve(static_cast<size_t>(repeats));
    for (int i = 0; i < repeats; ++i) {
      std::memset(flush_.data(), i & 0xff, flush_bytes_);
      const auto start = std::chrono::steady_clock::now();
      fn();
      const auto end = std::chrono::steady_clock::now();
      times.push_back(std::chrono::duration<double, std::milli>(end - start).count());
    }
    return summarize(std::move(times));
  }

 private:
  size_t flush_bytes_ = 0;
  std::vector<unsigned char> flush_;
};

struct Row {
  std::string op;
  std::string shape;
  std::string dtype;
  Measurement time;
  double bytes = 0;  // moved to and from memory (the minimum the op must move)
  double flops = 0;  // 0 when not compute-bound
  std::string note;  // e.g. "not implemented yet"
};

class Table {
 public:
  explicit Table(std::string title) : title_(std::move(title)) {}
  void add(Row row) { rows_.push_back(std::move(row)); }
  // Rows failing with an exception are kept, with its message as a note.
  void add_failure(std::string op, std::string shape, std::string dtype, const std::string& what) {
    rows_.push_back(failure(std::move(op), std::move(shape), std::move(dtype), what));
  }
  static Row failure(std::string op, std::string shape, std::string dtype, const std::string& what) {
    return Row{std::move(op), std::move(shape), std::move(dtype), {}, 0, 0, "skipped: " + first_line(what)};
  }
  // Prints the table; `reference_gbps` is the copy bandwidth of the same run.
  void print(double reference_gbps) const {
    print_header();
    for (const Row& row : rows_) print_row(row, reference_gbps);
  }
  // A streamed table: its header now, then each row as it is added (add_printed), so that a run
  // cut short (a deadline, a hung kernel) keeps the rows it measured.
  void print_header() const {
    std::printf("\n%s\n", title_.c_str());
    std::printf("%-28s %-18s %-9s %12s %10s %9s %8s\n", "op", "shape", "dtype", "median (us)", "GB/s", "TFLOP/s",
                "% copy");
    std::printf("%s\n", std::string(100, '-').c_str());
    std::fflush(stdout);
  }
  void add_printed(Row row, double reference_gbps) {
    print_row(row, reference_gbps);
    std::fflush(stdout);
    rows_.push_back(std::move(row));
  }

 private:
  static void print_row(const Row& row, double reference_gbps) {
    if (!row.note.empty()) {
      std::printf("%-28s %-18s %-9s %s\n", row.op.c_str(), row.shape.c_str(), row.dtype.c_str(), row.note.c_str());
      return;
    }
    const double seconds = row.time.median_ms * 1e-3;
    const double gbps = seconds > 0 ? row.bytes / seconds * 1e-9 : 0;
    char tflops[32] = "-";
    if (row.flops > 0 && seconds > 0) std::snprintf(tflops, sizeof(tflops), "%.2f", row.flops / seconds * 1e-12);
    std::printf("%-28s %-18s %-9s %12.1f %10.1f %9s %7.1f%%\n", row.op.c_str(), row.shape.c_str(), row.dtype.c_str(),
                row.time.median_ms * 1e3, gbps, tflops, reference_gbps > 0 ? 100.0 * gbps / reference_gbps : 0.0);
  }
  static std::string first_line(const std::string& text) {
    std::string line = text.substr(0, text.find('\n'));
    return line.size() > 90 ? line.substr(0, 90) + "..." : line;
  }
  std::string title_;
  std::vector<Row> rows_;
};

inline double gbps(double bytes, const Measurement& m) {
  return m.median_ms > 0 ? bytes / (m.median_ms * 1e-3) * 1e-9 : 0;
}

// What the device benchmarks (bench_kernels, bench_attention) take:
//   NAME [--cpu-only | --gpu-only] [--quick] [--repeats N]
struct DeviceBenchOptions {
  bool cpu = true;
  bool gpu = true;
  bool quick = false;  // small sizes, few repeats: a smoke test
  int repeats = 0;     // 0: the default of each device
};

// Parses the flags, prints the title line with the date, and runs `run_gpu`
// then `run_cpu` (each when asked). Returns the process's exit code.
template <typename RunGpu, typename RunCpu>
int run_device_bench(int argc, char** argv, const char* name, RunGpu&& run_gpu, RunCpu&& run_cpu) {
  DeviceBenchOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu-only") {
      options.gpu = false;
    } else if (arg == "--gpu-only") {
      options.cpu = false;
    } else if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--repeats" && i + 1 < argc) {
      options.repeats = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--cpu-only | --gpu-only] [--quick] [--repeats N]\n", argv[0]);
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  const std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("%s, %s%s\n", name, date, options.quick ? " (--quick: smoke-test sizes, not for RESULTS.md)" : "");
  try {
    if (options.gpu) run_gpu(options);
    if (options.cpu) run_cpu(options);
  } catch (const Error& error) {
    std::fprintf(stderr, "%s: %s\n", name, error.what());
    return 1;
  }
  return 0;
}

}  // namespace kiln::bench
