// CUDA graph capture and replay over raw streams (kernels/cuda/graph.h).
#include "kernels/cuda/graph.h"

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/check.h"
#include "kernels/error.h"

namespace kiln::cuda {

namespace {
// Captures this thread has begun and not ended (one, in practice).
thread_local int capture_depth = 0;
// What check_not_capturing refused during the current capture, if anything:
// the capture is then abandoned at its end (the region did not run as written).
thread_local std::string refused;
}  // namespace

void stream_begin_capture(Stream stream) {
  KILN_CHECK(stream != nullptr, "CUDA graph capture: the legacy default stream cannot be captured");
  KILN_CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
  ++capture_depth;
}

GraphExec stream_end_capture(Stream stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  --capture_depth;
  if (!refused.empty()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    const std::string what = refused;
    refused.clear();
    KILN_THROW("CUDA graph capture abandoned: ", what, " was refused inside the captured region");
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    KILN_THROW("CUDA graph capture failed: ", cudaGetErrorName(status), " (", cudaGetErrorString(status),
               "): an operation that cannot be recorded ran during the capture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  KILN_CUDA_CHECK(instantiated);
  return exec;
}

void graph_launch(GraphExec graph, Stream stream) {
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)));
}

void graph_destroy(GraphExec graph) {
  if (graph != nullptr) KILN_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph)));
}

namespace {
__global__ void set_replay_state_kernel(philox::ReplayState* state, uint64_t seed, uint64_t offset) {
  state->seed = seed;
  state->offset = offset;
}
}  // namespace

void set_replay_state(philox::ReplayState* state, uint64_t seed, uint64_t offset, Stream stream) {
  set_replay_state_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(state, seed, offset);
  check_last_launch("set_replay_state");
}

bool capturing() { return capture_depth > 0; }

void check_not_capturing(const char* what) {
  if (capture_depth > 0 && refused.empty()) refused = what;
  KILN_CHECK(capture_depth == 0, what, " was called while this thread captures a CUDA graph: a graph cannot record ",
             "a host read, a copy from host memory or a synchronization (keep .item(), .cpu(), prints and tensors ",
             "made from host data out of the captured region)");
}

RelaxedCapture::RelaxedCapture() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  KILN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  previous_ = static_cast<int>(mode);
}

RelaxedCapture::~RelaxedCapture() {
  cudaStreamCaptureMode mode = static_cast<cudaStreamCaptureMode>(previous_);
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace kiln::cuda
