// Linked when kiln is built without CUDA: the cuDNN convolution entry points throw.
#include "kernels/conv.h"
#include "kernels/error.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

void conv2d_forward_cuda(const Conv2dParams&, const ConvCudaConfig&, const void*, const void*, void*,
                         const WorkspaceAllocator&) {
  no_cuda("conv2d (cuda)");
}
void conv2d_backward_input_cuda(const Conv2dParams&, const ConvCudaConfig&, const void*, const void*, void*,
                                const WorkspaceAllocator&) {
  no_cuda("conv2d backward (cuda)");
}
void conv2d_backward_weight_cuda(const Conv2dParams&, const ConvCudaConfig&, const void*, const void*, void*,
                                 const WorkspaceAllocator&) {
  no_cuda("conv2d backward (cuda)");
}
// No cache without CUDA: empty counters rather than an error, so logging code runs anywhere.
CudnnConvCacheStats cudnn_conv_cache_stats() { return {}; }
void cudnn_conv_cache_clear() {}
int cudnn_conv_cache_put_refused_forward_for_testing(const Conv2dParams&, const ConvCudaConfig&) {
  no_cuda("cudnn_conv_cache_put_refused_forward_for_testing");
}
int cudnn_conv_cached_forward_algo_for_testing(const Conv2dParams&, const ConvCudaConfig&) {
  no_cuda("cudnn_conv_cached_forward_algo_for_testing");
}

std::string cudnn_graph_descriptors_check_for_testing(const Conv2dParams&, const ConvCudaConfig&, int, int) {
  no_cuda("cudnn_graph_descriptors_check_for_testing");
}

}  // namespace kiln::kernels
