// Linked when kiln is built without CUDA: tril / triu on CUDA throw.
#include "kernels/error.h"
#include "kernels/triangular.h"

namespace kiln::kernels {
void triangular_cuda(const TriangularArgs& args, cuda::Stream) {
  KILN_THROW(args.upper ? "triu" : "tril", " (cuda): kiln was built without CUDA");
}
}  // namespace kiln::kernels
