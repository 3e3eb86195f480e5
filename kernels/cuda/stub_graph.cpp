// Linked when kiln is built without CUDA: no graphs; nothing ever captures.
#include "kernels/cuda/graph.h"
#include "kernels/error.h"

namespace kiln::cuda {
void stream_begin_capture(Stream) { KILN_THROW("CUDA graph capture: kiln was built without CUDA"); }
GraphExec stream_end_capture(Stream) { KILN_THROW("CUDA graph capture: kiln was built without CUDA"); }
void graph_launch(GraphExec, Stream) { KILN_THROW("CUDA graph replay: kiln was built without CUDA"); }
void graph_destroy(GraphExec) {}
void set_replay_state(philox::ReplayState*, uint64_t, uint64_t, Stream) {
  KILN_THROW("CUDA graph replay: kiln was built without CUDA");
}
bool capturing() { return false; }
void check_not_capturing(const char*) {}
RelaxedCapture::RelaxedCapture() = default;
RelaxedCapture::~RelaxedCapture() = default;
}  // namespace kiln::cuda
