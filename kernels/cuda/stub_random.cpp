// Linked when kiln is built without CUDA: the random entry points throw.
#include "kernels/random.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* op) { KILN_THROW(op, ": kiln was built without CUDA"); }
}  // namespace

void uniform_cuda(void*, DType, int64_t, uint64_t, uint64_t, cuda::Stream, const philox::ReplayState*) {
  no_cuda("rand");
}
void normal_cuda(void*, DType, int64_t, uint64_t, uint64_t, cuda::Stream, const philox::ReplayState*) {
  no_cuda("randn");
}
void randint_cuda(void*, DType, int64_t, int64_t, uint64_t, uint64_t, uint64_t, cuda::Stream,
                  const philox::ReplayState*) {
  no_cuda("randint");
}
void dropout_cuda(const void*, void*, uint8_t*, DType, int64_t, float, double, uint64_t, uint64_t, cuda::Stream,
                  const philox::ReplayState*) {
  no_cuda("dropout");
}
void dropout_backward_cuda(const void*, const uint8_t*, void*, DType, int64_t, double, cuda::Stream) {
  no_cuda("dropout backward");
}

}  // namespace kiln::kernels
