// topk (core/ops.h): the kernels of kernels/sort.h find the indices along the
// last dim (the front end moves dim last); the values are a gather of x at
// them, so the gradient is gather's.
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/sort.h"

namespace kiln {

ValuesIndices topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  check_defined(x, "topk");
  KILN_CHECK(x.dtype() != DType::b8, "topk: bool tensors are not supported");
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);
  const int64_t d = wrap_dim(dim, ndim, "topk");
  const int64_t size = x.dim() == 0 ? 1 : x.size(d);
  KILN_CHECK(k >= 0 && k <= size, "topk: k = ", k, " is out of range for dim ", d, " of size ", size, " (shape ",
             shape_str(x.shape()), ")");
  Tensor indices;
  {
    NoGradGuard no_grad;
    const Tensor rows = (x.dim() == 0 ? x.reshape({1}) : x).transpose(d, ndim - 1).contiguous();
    Shape out_shape = rows.shape();
    out_shape.back() = k;
    Tensor values = empty(out_shape, {.dtype = x.dtype(), .device = x.device()});
    indices = empty(out_shape, {.dtype = DType::i64, .device = x.device()});
    kernels::TopkArgs args;
    args.dtype = x.dtype();
    args.x = rows.data_ptr();
    args.cols = size;
    args.rows = size == 0 ? 0 : rows.numel() / size;
    args.k = k;
    args.largest = largest;
    args.values = values.data_ptr();
    args.indices = indices.data<int64_t>();
    if (args.rows > 0 && k > 0) {
      if (x.is_cpu()) {
        kernels::topk_cpu(args);
      } else {
        const cuda::DeviceScope scope(x.device().index, "topk");
        const size_t bytes = kernels::topk_cuda_workspace_bytes(args);
        Tensor workspace = empty({static_cast<int64_t>(bytes)}, {.dtype = DType::u8, .device = x.device()});
        kernels::topk_cuda(args, workspace.data_ptr(), bytes, scope.stream);
      }
    }
    indices = indices.transpose(d, ndim - 1);
    if (x.dim() == 0) indices = indices.reshape({});
  }
  // Values through gather: differentiable, and the same numbers the kernel chose.
  return {gather(x.dim() == 0 ? x.reshape({1}) : x, x.dim() == 0 ? 0 : d, x.dim() == 0 ? indices.reshape({1}) : indices)
              .reshape(indices.shape()),
          indices};
}

}  // namespace kiln
