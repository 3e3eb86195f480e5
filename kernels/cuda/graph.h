// CUDA graphs over raw streams: capture the work queued on a stream once,
// instantiate it, replay it with one launch. No Tensor here: core/cuda_graph.h
// builds kiln::cuda::Graph (with its memory pool) on these.
//
// Capture runs in CUDA's thread-local mode: while this thread captures, a
// synchronization or a host read would invalidate the capture, so kiln's own
// synchronizing calls (runtime.h: stream/device/event synchronize, a
// device-to-host copy) throw kiln::Error first, naming what tried to run.
// cudaMalloc, which capture would also refuse, is let through for the
// caching allocator (RelaxedCapture): the memory it returns outlives the
// graph in the graph's pool, so the recorded work stays valid.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/philox.h"

namespace kiln::cuda {

using GraphExec = void*;  // cudaGraphExec_t

// Starts recording `stream` (not the legacy default stream).
void stream_begin_capture(Stream stream);
// Stops recording and instantiates the graph. Throws kiln::Error with CUDA's
// reason when the capture was invalidated, or naming what check_not_capturing
// refused during it (the region did not record what it meant to); the stream
// is usable again either way.
GraphExec stream_end_capture(Stream stream);
// Queues one replay of `graph` on `stream` (asynchronous).
void graph_launch(GraphExec graph, Stream stream);
void graph_destroy(GraphExec graph);

// Writes a graph's per-replay Philox state on `stream` (a one-thread kernel:
// the values travel as its arguments, so a later replay cannot overwrite
// them before this one reads them).
void set_replay_state(philox::ReplayState* state, uint64_t seed, uint64_t offset, Stream stream);

// Whether this thread is capturing a stream now.
bool capturing();
// Throws kiln::Error naming `what` when this thread is capturing: `what`
// would synchronize with the host, which a graph cannot record.
void check_not_capturing(const char* what);

// While alive, this thread may call cudaMalloc during a capture (CUDA's
// relaxed mode, restored on exit). The caching allocator's only user.
class RelaxedCapture {
 public:
  RelaxedCapture();
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace kiln::cuda
