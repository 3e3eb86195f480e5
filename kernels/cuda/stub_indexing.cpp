// Linked when kiln is built without CUDA: every CUDA indexing entry point throws.
#include "kernels/error.h"
#include "kernels/indexing.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) { KILN_THROW(what, ": kiln was built without CUDA"); }
}  // namespace

void gather_cuda(const IndexArgs&, cuda::Stream) { no_cuda("gather"); }
void scatter_add_cuda(const IndexArgs&, cuda::Stream) { no_cuda("scatter_add"); }
size_t scatter_add_sorted_workspace_bytes(int64_t) { no_cuda("scatter_add"); }
void scatter_add_sorted_cuda(const IndexArgs&, int64_t, void*, size_t, cuda::Stream) { no_cuda("scatter_add"); }
size_t index_add_sorted_workspace_bytes(int64_t) { no_cuda("index_add"); }
void index_add_sorted_cuda(const IndexAddArgs&, void*, size_t, cuda::Stream) { no_cuda("index_add"); }
IndexError index_error_cuda(int, cuda::Stream) { no_cuda("index_error_cuda"); }

}  // namespace kiln::kernels
