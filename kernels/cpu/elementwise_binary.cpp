// CPU binary elementwise ops (arithmetic, comparisons, fused activation
// backwards). The formulas live in kernels/elementwise_math.h, shared with CUDA.
#include "kernels/cpu/elementwise_loop.h"
#include "kernels/elementwise.h"
#include "kernels/elementwise_math.h"

namespace kiln::kernels {

void binary_cpu(BinaryOp op, const IterShape& shape, const Operand& out, const Operand& a, const Operand& b,
                double s0, double s1) {
  math::check_operands(binary_op_name(op), is_predicate(op), out, a, &b);
  const Operand operands[3] = {out, a, b};
  math::dispatch_binary(op, a.dtype, s0, s1, [&]<typename Out, typename A, typename B>(auto f) {
    cpu::elementwise_loop<Out, A, B>(shape, operands, f);
  });
}

}  // namespace kiln::kernels
