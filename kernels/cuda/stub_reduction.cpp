// Linked when kiln is built without CUDA: the reduction entry points throw.
#include "kernels/reduction.h"

namespace kiln::kernels {

int64_t reduce_cuda_workspace_bytes(const ReduceArgs&) { return 0; }
void reduce_cuda(const ReduceArgs&, void*, cuda::Stream) { KILN_THROW("reduce: kiln was built without CUDA"); }
void reduce_grad_cuda(const ReduceGradArgs&, cuda::Stream) {
  KILN_THROW("reduce backward: kiln was built without CUDA");
}

}  // namespace kiln::kernels
