// CUDA binary elementwise ops (arithmetic, comparisons, fused activation
// backwards). The formulas live in kernels/elementwise_math.h (shared with the
// CPU), the launcher in elementwise_launch.cuh.
#include "kernels/cuda/elementwise_launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/elementwise_math.h"

namespace kiln::kernels {

void binary_cuda(BinaryOp op, const IterShape& shape, const Operand& out, const Operand& a, const Operand& b,
                 double s0, double s1, cuda::Stream stream) {
  const std::string_view name = binary_op_name(op);
  const Operand operands[3] = {out, a, b};
  if (is_mixed_add(op, out.dtype, a.dtype, b.dtype)) {
    math::dispatch_mixed_add(a.dtype, b.dtype, s0, [&]<typename Out, typename A, typename B>(auto f) {
      cuda_detail::launch<Out, A, B>(shape, operands, f, stream, name.data());
    });
    return;
  }
  math::check_operands(name, is_predicate(op), out, a, &b);
  math::dispatch_binary(op, a.dtype, s0, s1, [&]<typename Out, typename A, typename B>(auto f) {
    cuda_detail::launch<Out, A, B>(shape, operands, f, stream, name.data());
  });
}

}  // namespace kiln::kernels
