// CUDA unary elementwise ops and where(); binary ops are in
// elementwise_binary.cu. The formulas live in kernels/elementwise_math.h
// (shared with the CPU), the launcher in elementwise_launch.cuh.
#include "kernels/cuda/elementwise_launch.cuh"
#include "kernels/elementwise.h"
#include "kernels/elementwise_math.h"

namespace kiln::kernels {

void unary_cuda(UnaryOp op, const IterShape& shape, const Operand& out, const Operand& x, double s0, double s1,
                cuda::Stream stream) {
  const std::string_view name = unary_op_name(op);
  math::check_operands(name, is_predicate(op), out, x, nullptr);
  const Operand operands[2] = {out, x};
  math::dispatch_unary(op, x.dtype, s0, s1, [&]<typename Out, typename In>(auto f) {
    cuda_detail::launch<Out, In>(shape, operands, f, stream, name.data());
  });
}

void where_cuda(const IterShape& shape, const Operand& out, const Operand& condition, const Operand& a,
                const Operand& b, cuda::Stream stream) {
  KILN_CHECK(condition.dtype == DType::b8, "where: expected a bool condition, got ", dtype_name(condition.dtype));
  math::check_operands("where", false, out, a, &b);
  const Operand operands[4] = {out, condition, a, b};
  math::dispatch_where(a.dtype, [&]<typename Out, typename... In>(auto f) {
    cuda_detail::launch<Out, In...>(shape, operands, f, stream, "where");
  });
}

}  // namespace kiln::kernels
