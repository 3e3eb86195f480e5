// Linked when kiln is built without CUDA: the CUDA elementwise entry points throw.
#include "kernels/elementwise.h"

namespace kiln::kernels {

void unary_cuda(UnaryOp op, const IterShape&, const Operand&, const Operand&, double, double, cuda::Stream) {
  KILN_THROW(unary_op_name(op), ": kiln was built without CUDA");
}
void binary_cuda(BinaryOp op, const IterShape&, const Operand&, const Operand&, const Operand&, double, double,
                 cuda::Stream) {
  KILN_THROW(binary_op_name(op), ": kiln was built without CUDA");
}
void where_cuda(const IterShape&, const Operand&, const Operand&, const Operand&, const Operand&, cuda::Stream) {
  KILN_THROW("where: kiln was built without CUDA");
}

}  // namespace kiln::kernels
