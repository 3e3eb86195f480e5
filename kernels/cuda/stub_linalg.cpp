// Linked when kiln is built without CUDA: the GEMM entry points throw.
#include "kernels/linalg.h"

namespace kiln::kernels {

void gemm_cuda(const GemmProblem&, bool, void*, size_t, int, cuda::Stream) {
  KILN_THROW("matmul: kiln was built without CUDA");
}
size_t gemm_cuda_workspace_bytes(int) { KILN_THROW("matmul: kiln was built without CUDA"); }

}  // namespace kiln::kernels
