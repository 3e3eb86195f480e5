// Linked when kiln is built without CUDA: the softmax and loss entry points throw.
#include "kernels/softmax.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* op) { KILN_THROW(op, ": kiln was built without CUDA"); }
}  // namespace

void softmax_cuda(const SoftmaxArgs&, cuda::Stream) { no_cuda("softmax"); }
void softmax_grad_cuda(const SoftmaxGradArgs&, cuda::Stream) { no_cuda("softmax backward"); }
void cross_entropy_cuda(const CrossEntropyArgs&, cuda::Stream) { no_cuda("cross_entropy"); }
void cross_entropy_grad_cuda(const CrossEntropyGradArgs&, cuda::Stream) { no_cuda("cross_entropy backward"); }
void nll_loss_cuda(const NllLossArgs&, cuda::Stream) { no_cuda("nll_loss"); }
void nll_loss_grad_cuda(const NllLossGradArgs&, cuda::Stream) { no_cuda("nll_loss backward"); }

}  // namespace kiln::kernels
