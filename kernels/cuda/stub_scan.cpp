// Linked when kiln is built without CUDA: the scan entry points throw.
#include "kernels/error.h"
#include "kernels/scan.h"

namespace kiln::kernels {
void cumsum_cuda(const ScanArgs&, cuda::Stream) { KILN_THROW("cumsum (cuda): kiln was built without CUDA"); }
}  // namespace kiln::kernels
