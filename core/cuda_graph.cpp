#include "core/cuda_graph.h"

#include <atomic>

#include "core/allocator.h"
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
}

Graph::~Graph() {
  try {
    if (capturing_) {
      capturing_ = false;
      (void)stream_end_capture(capture_stream_);
    }
  } catch (...) {
  }
  try {
    graph_destroy(exec_);
    cuda_allocator(device_).end_pool(capture_stream_);
    cuda_allocator(device_).release_pool(pool_);
    destroy_event(ordering_);
    destroy_stream(capture_stream_);
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
  capturing_ = true;
}

void Graph::capture_end() {
  KILN_CHECK(capturing_, "cuda::Graph::capture_end: not capturing");
  DeviceGuard guard(device_, "cuda::Graph::capture_end");
  capturing_ = false;
  set_current_stream(device_, previous_stream_);
  cuda_allocator(device_).end_pool(capture_stream_);
  exec_ = stream_end_capture(capture_stream_);  // throws when the capture was invalidated
}

void Graph::replay() {
  KILN_CHECK(exec_ != nullptr, "cuda::Graph::replay: nothing was captured");
  DeviceGuard guard(device_, "cuda::Graph::replay");
  graph_launch(exec_, current_stream(device_));
}

void Graph::reset() {
  KILN_CHECK(!capturing_, "cuda::Graph::reset: capturing");
  graph_destroy(exec_);
  exec_ = nullptr;
}

}  // namespace kiln::cuda
