// cumsum (core/ops.h): the kernels of kernels/scan.h over (outer, length,
// inner); the backward is the reversed running sum of the gradient.
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/scan.h"

namespace kiln {

namespace {

Tensor running_sum(const Tensor& x_in, int64_t dim, bool reverse) {
  const int64_t d = wrap_dim(dim, std::max<int64_t>(x_in.dim(), 1), "cumsum");
  const bool floating = is_floating(x_in.dtype());
  Tensor x, out;
  kernels::ScanArgs args;
  {
    NoGradGuard no_grad;
    x = x_in.contiguous();
    args.dtype = x.dtype();
    args.out_dtype = floating ? x.dtype() : DType::i64;
    out = empty(x.shape(), {.dtype = args.out_dtype, .device = x.device()});
  }
  if (x.dim() > 0) {
    for (int64_t k = 0; k < d; ++k) args.outer *= x.size(k);
    args.length = x.size(d);
    for (int64_t k = d + 1; k < x.dim(); ++k) args.inner *= x.size(k);
  } else {
    args.length = 1;
  }
  args.x = x.data_ptr();
  args.out = out.data_ptr();
  args.reverse = reverse;
  if (out.numel() > 0) {
    if (x.is_cpu()) {
      kernels::cumsum_cpu(args);
    } else {
      kernels::cumsum_cuda(args, launch_on(x, "cumsum").stream);
    }
  }
  return out;
}

}  // namespace

Tensor cumsum(const Tensor& x, int64_t dim) {
  check_defined(x, "cumsum");
  Tensor out = running_sum(x, dim, /*reverse=*/false);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("cumsum", {x}, {out}, [dim](const autograd::TensorList& grads) {
      return autograd::TensorList{running_sum(grads[0], dim, /*reverse=*/true)};
    });
  }
  return out;
}

}  // namespace kiln
