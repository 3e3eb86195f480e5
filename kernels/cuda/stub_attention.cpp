// Linked when kiln is built without CUDA: the CUDA attention entry points throw,
// and attention_cuda_supports() says no, so the front end never picks them.
#include "kernels/attention.h"
#include "kernels/error.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

void attention_forward_cuda(const AttentionArgs&, void*, void*, cuda::Stream) {
  no_cuda("scaled_dot_product_attention (cuda)");
}
size_t attention_backward_workspace_bytes(const AttentionGradArgs&) { return 0; }
void attention_backward_cuda(const AttentionGradArgs&, void*, cuda::Stream) {
  no_cuda("scaled_dot_product_attention backward (cuda)");
}
bool attention_cuda_supports(DType, int64_t) { return false; }

namespace {
AttentionCudaKernels cuda_kernels = AttentionCudaKernels::tensor_core;  // kept, without effect
bool wgmma_backward = false;                                           // likewise
}  // namespace
void set_attention_wgmma_backward(bool on) { wgmma_backward = on; }
bool attention_wgmma_backward() { return wgmma_backward; }
void set_attention_cuda_kernels(AttentionCudaKernels kernels) { cuda_kernels = kernels; }
AttentionCudaKernels attention_cuda_kernels() { return cuda_kernels; }
void set_attention_forward_shape(int index) {
  KILN_CHECK(index == 0, "set_attention_forward_shape: ", index, " is not a shape index (without CUDA only 0)");
}
int attention_forward_shape() { return 0; }
int attention_forward_shape_count() { return 1; }
bool attention_forward_shape_applies(int index, int64_t head_dim) { return index == 0 && head_dim > 0; }
const char* attention_forward_shape_name(int index) { return index == 0 ? "the default (no CUDA)" : ""; }

}  // namespace kiln::kernels
