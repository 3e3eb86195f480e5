// Linked when kiln is built without CUDA: every NCCL entry point throws.
#include "kernels/error.h"
#include "kernels/nccl.h"

namespace kiln::kernels::nccl {

namespace {
[[noreturn]] void no_nccl(const char* what) {
  KILN_THROW("NCCL ", what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

UniqueId get_unique_id() { no_nccl("get_unique_id"); }
Comm comm_init_rank(const UniqueId&, int, int, int, int64_t) { no_nccl("comm_init_rank"); }
void comm_destroy(Comm) {}
void comm_abort(Comm) {}
std::string comm_async_error(Comm) { return ""; }
void all_reduce(const void*, void*, size_t, DType, RedOp, Comm, cuda::Stream, int64_t) { no_nccl("all_reduce"); }
void broadcast(const void*, void*, size_t, DType, int, Comm, cuda::Stream, int64_t) { no_nccl("broadcast"); }
void all_gather(const void*, void*, size_t, DType, Comm, cuda::Stream, int64_t) { no_nccl("all_gather"); }
void reduce_scatter(const void*, void*, size_t, DType, RedOp, Comm, cuda::Stream, int64_t) {
  no_nccl("reduce_scatter");
}

}  // namespace kiln::kernels::nccl
