// Op-level profiling and NVTX ranges.
//
// kiln has no dispatcher that every op passes through (each op's front end
// calls its kernels directly), so the op profiler works at autograd-node
// granularity, from two hooks in core/autograd.cpp that cost one branch when
// no profiler is on:
//   - record() counts, per op name, the nodes recorded: the calls of
//     differentiable ops made with grad on (ops under no_grad are not seen);
//   - the backward engine times every node it runs: host time, and on CUDA
//     the device time between events recorded on the current stream around
//     it, plus an NVTX range named "<op>_backward".
// Forward time is measured per labelled range (RecordFunction, as
// torch.profiler.record_function), e.g. the Trainer's training_step.
// Reading CUDA times waits for the events: do it after the work, not per step.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

namespace autograd {
class Node;
}

// ---------------------------------------------------------------- NVTX

// Nsight Systems ranges (nvtxRangePushA/Pop). No-ops when kiln is built
// without CUDA; almost free when no tool is attached.
void nvtx_range_push(const char* name);
void nvtx_range_pop();

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtx_range_push(name); }
  explicit NvtxRange(const std::string& name) { nvtx_range_push(name.c_str()); }
  ~NvtxRange() { nvtx_range_pop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// ---------------------------------------------------------------- op profiler

struct OpStats {
  std::string name;                  // the op's name, as in error messages ("matmul")
  int64_t forward_calls = 0;         // autograd nodes recorded
  int64_t backward_calls = 0;        // backward node runs
  double backward_cpu_seconds = 0;   // host time in them (on CUDA: launching, not running)
  double backward_cuda_seconds = 0;  // device time on their stream (0 on the CPU)
};

struct RangeStats {
  std::string name;
  int64_t calls = 0;
  double cpu_seconds = 0;
  double cuda_seconds = 0;
};

class OpProfiler {
 public:
  OpProfiler() = default;
  ~OpProfiler();  // stops if active and frees its CUDA events
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  // Makes this the calling thread's active profiler (backward runs on the
  // thread that calls it). Throws kiln::Error if one is active already.
  void start();
  void stop();
  bool active() const;
  void reset();

  // Sorted by total time, CUDA time first when there is any. Waits for the
  // CUDA events still pending (a device synchronization).
  std::vector<OpStats> op_stats();
  std::vector<RangeStats> range_stats();
  // Tables like torch.profiler's key_averages().table(): ops, then ranges;
  // at most row_limit rows each (-1: all). CUDA columns only when there was CUDA time.
  std::string table(int row_limit = -1);

  // An interval being timed. begin() takes the host time and, for a CUDA
  // device, records an event on its current stream; end() closes it.
  enum class Kind { range, backward_node };
  struct Interval {
    std::string name;
    Kind kind = Kind::range;
    Device device;
    std::chrono::steady_clock::time_point start;
    cuda::Event start_event = nullptr;
  };
  Interval begin(std::string name, Kind kind, Device device);
  void end(Interval interval);
  // The record() hook.
  void count_forward(const char* name);

 private:
  struct Pending {
    std::string name;
    Kind kind;
    int device;
    cuda::Event start_event;
    cuda::Event end_event;
  };
  cuda::Event take_event(int device);
  void resolve_pending(bool wait);

  std::map<std::string, OpStats> ops_;
  std::map<std::string, RangeStats> ranges_;
  std::vector<Pending> pending_;
  std::map<int, std::vector<cuda::Event>> free_events_;  // by device: an event records only on its own
  bool active_ = false;
};

// The calling thread's active op profiler, or null: the hooks' one branch.
OpProfiler* active_op_profiler();

// A labelled range (torch.profiler.record_function): an NVTX range, and a
// row of the active op profiler's range table when one is on. `device`
// selects the stream whose time is measured (the CPU: host time only).
class RecordFunction {
 public:
  explicit RecordFunction(std::string name, Device device = Device::cpu());
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  OpProfiler* profiler_;
  OpProfiler::Interval interval_;
};

// The backward engine's hook around one node: nothing unless a profiler is on.
class BackwardNodeScope {
 public:
  explicit BackwardNodeScope(const autograd::Node& node) : profiler_(active_op_profiler()) {
    if (profiler_ != nullptr) begin(node);
  }
  ~BackwardNodeScope() {
    if (profiler_ != nullptr) end();
  }
  BackwardNodeScope(const BackwardNodeScope&) = delete;
  BackwardNodeScope& operator=(const BackwardNodeScope&) = delete;

 private:
  void begin(const autograd::Node& node);
  void end();
  OpProfiler* profiler_;
  OpProfiler::Interval interval_;
};

}  // namespace kiln
