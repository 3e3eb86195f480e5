// Linked when kiln is built without CUDA: the pooling entry points throw.
#include "kernels/error.h"
#include "kernels/pool.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

void max_pool2d_forward_cuda(DType, const Pool2dParams&, const void*, void*, int32_t*, cuda::Stream) {
  no_cuda("max_pool2d (cuda)");
}
void max_pool2d_backward_cuda(DType, const Pool2dParams&, const void*, const int32_t*, void*, cuda::Stream) {
  no_cuda("max_pool2d backward (cuda)");
}
void avg_pool2d_forward_cuda(DType, const Pool2dParams&, const void*, void*, cuda::Stream) {
  no_cuda("avg_pool2d (cuda)");
}
void avg_pool2d_backward_cuda(DType, const Pool2dParams&, const void*, void*, cuda::Stream) {
  no_cuda("avg_pool2d backward (cuda)");
}
void adaptive_avg_pool2d_forward_cuda(DType, const Pool2dParams&, const void*, void*, cuda::Stream) {
  no_cuda("adaptive_avg_pool2d (cuda)");
}
void adaptive_avg_pool2d_backward_cuda(DType, const Pool2dParams&, const void*, void*, cuda::Stream) {
  no_cuda("adaptive_avg_pool2d backward (cuda)");
}

}  // namespace kiln::kernels
