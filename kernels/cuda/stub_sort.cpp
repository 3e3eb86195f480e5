// Linked when kiln is built without CUDA: the sort entry points throw.
#include "kernels/error.h"
#include "kernels/sort.h"

namespace kiln::kernels {
size_t topk_cuda_workspace_bytes(const TopkArgs&) { return 0; }
void topk_cuda(const TopkArgs&, void*, size_t, cuda::Stream) { KILN_THROW("topk (cuda): kiln was built without CUDA"); }
}  // namespace kiln::kernels
