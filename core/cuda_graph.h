// kiln::cuda::Graph, in the shape of torch.cuda.CUDAGraph: record the CUDA
// work of a region once, then replay it with one launch (no kernel-launch
// cost per op, no host work).
//
//   cuda::Graph graph;
//   Tensor static_input = empty(shape, {.device = Device::cuda()});
//   graph.capture_begin();
//   Tensor static_output = model.forward(static_input);  // recorded, not run
//   graph.capture_end();
//   for (...) { static_input.copy_(next_batch); graph.replay(); use(static_output); }
//
// During the capture the device's current stream is the graph's own capture
// stream (it first waits for the work queued before capture_begin), and every
// tensor allocated there comes from the graph's memory pool in the caching
// allocator (memory_stats' graph_pool_bytes), so replays allocate nothing and
// reuse exactly the addresses they recorded. A host read or synchronization
// inside the region (.item(), .cpu(), printing a CUDA tensor) throws
// kiln::Error naming it, and capture_end then throws too: the capture is
// abandoned, since the region did not record what it meant to.
// Random ops recorded in the graph (dropout, rand) draw new numbers at every
// replay: during the capture the device's default generator counts their
// draws relative to a seed and offset the graph keeps in device memory, and
// replay() reserves that many counters from the generator and writes them
// there (a one-thread kernel) before launching the graph; during the capture
// the generator's state() is the graph's, so activation checkpointing's
// recompute repeats its forward's draws. The graph, its pool and its stream go
// with the object (destroyed mid-capture, it ends the capture and puts the
// thread's stream back).
// Also refused during a capture, each with kiln::Error naming it: a copy from
// host memory (a replay would read the host buffer again), creating optimizer
// state (its first values would be set again at every replay: take an eager
// step first), empty_cache. The caching allocator makes no device call but
// cudaMalloc while a thread captures; what must go back to the device waits
// for its first call after the capture.
#pragma once

#include <cstdint>

#include "kernels/cuda/graph.h"
#include "kernels/cuda/runtime.h"

namespace kiln::cuda {

class Graph {
 public:
  // `device` -1: the current device. Throws kiln::Error without a GPU.
  explicit Graph(int device = -1);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts recording this thread's CUDA work on the graph's device.
  void capture_begin();
  // Stops recording and instantiates the graph; throws kiln::Error when the
  // capture was invalidated (the region is then not captured).
  void capture_end();
  // Queues the recorded work on the device's current stream (asynchronous).
  // Throws kiln::Error when nothing was captured.
  void replay();
  // Drops the recorded graph (its pool stays, for a new capture).
  void reset();

  bool captured() const { return exec_ != nullptr; }
  bool capturing() const { return capturing_; }
  int device() const { return device_; }
  // The graph's memory pool in the caching allocator of its device.
  uint64_t pool() const { return pool_; }

 private:
  int device_;
  uint64_t pool_;
  Stream capture_stream_ = nullptr;
  Stream previous_stream_ = nullptr;
  Event ordering_ = nullptr;
  GraphExec exec_ = nullptr;
  bool capturing_ = false;
  void* replay_state_ = nullptr;   // philox::ReplayState on the device (allocated outside the pool)
  uint64_t replay_counters_ = 0;   // Philox counters one replay draws
};

}  // namespace kiln::cuda
