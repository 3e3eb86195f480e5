#include "core/cuda_graph.h"

#include <atomic>

#include "core/allocator.h"
#include "core/generator.h"
#include "kernels/error.h"

namespace kiln::cuda {

namespace {
std::atomic<uint64_t> next_pool{1};
}  // namespace

Graph::Graph(int device) : device_(device < 0 ? current_device() : device), pool_(next_pool.fetch_add(1)) {
  KILN_CHECK(device_count() > 0, "cuda::Graph: no CUDA device is available (", availability().problem, ")");
  DeviceGuard guard(device_, "cuda::Graph");
  capture_stream_ = create_stream(device_);
  ordering_ = create_event(device_, /*timing=*/false);
  replay_state_ = raw_malloc(sizeof(philox::ReplayState), device_);
  KILN_CHECK(replay_state_ != nullptr, "cuda::Graph: out of memory on cuda:", device_);
}

Graph::~Graph() {
  try {
    if (capturing_) {  // an exception unwound through the captured region
      capturing_ = false;
      (void)default_generator(Device::cuda(device_)).end_graph();
      set_current_stream(device_, previous_stream_);  // the capture stream is destroyed below
      cuda_allocator(device_).end_pool(capture_stream_);
      graph_destroy(stream_end_capture(capture_stream_));  // what was recorded is not wanted
    }
  } catch (...) {
  }
  try {
    graph_destroy(exec_);
    cuda_allocator(device_).end_pool(capture_stream_);
    cuda_allocator(device_).release_pool(pool_);
    destroy_event(ordering_);
    destroy_stream(capture_stream_);
    raw_free(replay_state_, device_);
  } catch (...) {
  }
}

void Graph::capture_begin() {
  KILN_CHECK(!capturing_, "cuda::Graph::capture_begin: already capturing");
  KILN_CHECK(exec_ == nullptr, "cuda::Graph::capture_begin: a graph was captured already (reset() it first)");
  DeviceGuard guard(device_, "cuda::Graph::capture_begin");
  // The recorded work depends on nothing: what is queued now must finish first.
  previous_stream_ = current_stream(device_);
  record_event(ordering_, previous_stream_);
  stream_wait_event(capture_stream_, ordering_);
  cuda_allocator(device_).begin_pool(capture_stream_, pool_);
  set_current_stream(device_, capture_stream_);
  try {
    stream_begin_capture(capture_stream_);
  } catch (...) {
    set_current_stream(device_, previous_stream_);
    cuda_allocator(device_).end_pool(capture_stream_);
    throw;
  }
  default_generator(Device::cuda(device_)).begin_graph(static_cast<philox::ReplayState*>(replay_state_));
  capturing_ = true;
}

void Graph::capture_end() {
  KILN_CHECK(capturing_, "cuda::Graph::capture_end: not capturing");
  DeviceGuard guard(device_, "cuda::Graph::capture_end");
  capturing_ = false;
  replay_counters_ = default_generator(Device::cuda(device_)).end_graph();
  set_current_stream(device_, previous_stream_);
  cuda_allocator(device_).end_pool(capture_stream_);
  exec_ = stream_end_capture(capture_stream_);  // throws when the capture was invalidated
}

void Graph::replay() {
  KILN_CHECK(exec_ != nullptr, "cuda::Graph::replay: nothing was captured");
  DeviceGuard guard(device_, "cuda::Graph::replay");
  const Stream stream = current_stream(device_);
  if (replay_counters_ > 0) {
    const GeneratorState drawn = default_generator(Device::cuda(device_)).advance(replay_counters_);
    set_replay_state(static_cast<philox::ReplayState*>(replay_state_), drawn.seed, drawn.offset, stream);
  }
  graph_launch(exec_, stream);
}

void Graph::reset() {
  KILN_CHECK(!capturing_, "cuda::Graph::reset: capturing");
  graph_destroy(exec_);
  exec_ = nullptr;
}

}  // namespace kiln::cuda
