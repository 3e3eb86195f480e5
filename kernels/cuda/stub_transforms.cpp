// Linked when kiln is built without CUDA: the augmentation kernels' CUDA entry points throw.
#include "kernels/transforms.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) { KILN_THROW(what, ": kiln was built without CUDA"); }
}  // namespace

void random_crop_cuda(float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, float, const int64_t*, uint64_t,
                      uint64_t, uint32_t, cuda::Stream) {
  no_cuda("random_crop_cuda");
}
void horizontal_flip_cuda(float*, int64_t, int64_t, int64_t, int64_t, float, const int64_t*, uint64_t, uint64_t,
                          uint32_t, cuda::Stream) {
  no_cuda("horizontal_flip_cuda");
}
void normalize_cuda(float*, int64_t, int64_t, const NormalizeParams&, cuda::Stream) { no_cuda("normalize_cuda"); }
void random_erasing_cuda(float*, int64_t, int64_t, int64_t, int64_t, const ErasingParams&, const int64_t*, uint64_t,
                         uint64_t, uint32_t, cuda::Stream) {
  no_cuda("random_erasing_cuda");
}
void gather_rows_cuda(const void*, DType, int64_t, const int64_t*, int64_t, void*, DType, float, cuda::Stream) {
  no_cuda("gather_rows_cuda");
}

}  // namespace kiln::kernels
