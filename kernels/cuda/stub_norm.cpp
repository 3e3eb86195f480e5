// Linked when kiln is built without CUDA: the normalization entry points throw.
#include "kernels/error.h"
#include "kernels/norm.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

size_t batch_norm_workspace_bytes(const BatchNormArgs&) { no_cuda("batch_norm (cuda)"); }
void batch_norm_forward_cuda(const BatchNormArgs&, const void*, const void*, const void*, void*, void*, void*, void*,
                             void*, void*, cuda::Stream) {
  no_cuda("batch_norm (cuda)");
}
void batch_norm_backward_cuda(const BatchNormArgs&, const void*, const void*, const void*, const void*, const void*,
                              const void*, void*, void*, void*, void*, cuda::Stream) {
  no_cuda("batch_norm backward (cuda)");
}
void batch_norm_relu_max_pool2d_forward_cuda(const BatchNormArgs&, int64_t, int64_t, const void*, const void*,
                                             const void*, void*, void*, void*, int32_t*, void*, void*, void*,
                                             cuda::Stream) {
  no_cuda("batch_norm_relu_max_pool2d (cuda)");
}
void batch_norm_relu_max_pool2d_backward_cuda(const BatchNormArgs&, int64_t, int64_t, const void*, const void*,
                                              const int32_t*, const void*, const void*, const void*, const void*,
                                              void*, void*, void*, void*, cuda::Stream) {
  no_cuda("batch_norm_relu_max_pool2d backward (cuda)");
}
size_t layer_norm_workspace_bytes(const LayerNormArgs&) { no_cuda("layer_norm (cuda)"); }
void layer_norm_forward_cuda(const LayerNormArgs&, const void*, const void*, const void*, void*, void*, void*,
                             cuda::Stream) {
  no_cuda("layer_norm (cuda)");
}
void layer_norm_backward_cuda(const LayerNormArgs&, const void*, const void*, const void*, const void*, const void*,
                              void*, void*, void*, void*, cuda::Stream) {
  no_cuda("layer_norm backward (cuda)");
}

}  // namespace kiln::kernels
