// tril / triu (core/ops.h) over the last two dims with kernels/triangular.h;
// the op is linear, so its backward is the same op on the gradient.
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/triangular.h"

namespace kiln {

namespace {

Tensor triangle(const Tensor& x_in, int64_t diagonal, bool upper) {
  const char* op = upper ? "triu" : "tril";
  check_defined(x_in, op);
  KILN_CHECK(x_in.dim() >= 2, op, ": expected a tensor of at least 2 dims, got shape ", shape_str(x_in.shape()));
  Tensor x, out;
  {
    NoGradGuard no_grad;
    x = x_in.contiguous();
    out = empty(x.shape(), {.dtype = x.dtype(), .device = x.device()});
  }
  kernels::TriangularArgs args;
  args.dtype = x.dtype();
  args.x = x.data_ptr();
  args.out = out.data_ptr();
  args.rows = x.size(-2);
  args.cols = x.size(-1);
  args.batch = args.rows * args.cols == 0 ? 0 : x.numel() / (args.rows * args.cols);
  args.diagonal = diagonal;
  args.upper = upper;
  if (out.numel() > 0) {
    if (x.is_cpu()) {
      kernels::triangular_cpu(args);
    } else {
      kernels::triangular_cuda(args, launch_on(x, op).stream);
    }
  }
  if (autograd::any_requires_grad({&x_in})) {
    autograd::record(op, {x_in}, {out}, [diagonal, upper](const autograd::TensorList& grads) {
      return autograd::TensorList{triangle(grads[0], diagonal, upper)};
    });
  }
  return out;
}

}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, /*upper=*/false); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, /*upper=*/true); }

}  // namespace kiln
