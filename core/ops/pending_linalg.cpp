// Placeholders for the linalg ops not written yet: each throws. The owner of
// core/ops/linalg.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor matmul(const Tensor&, const Tensor&) { KILN_THROW("matmul: not implemented yet"); }
Tensor mm(const Tensor&, const Tensor& b);    // (n, k) @ (k, m) Tensor bmm(const Tensor&, const Tensor& b);   // (B, n, k) @ (B, k, m) Tensor linear(const Tensor&, const Tensor&, const Tensor&) { KILN_THROW("mm: not implemented yet"); }
void set_allow_tf32(bool) { KILN_THROW("set_allow_tf32: not implemented yet"); }
bool allow_tf32() { KILN_THROW("allow_tf32: not implemented yet"); }

}  // namespace kiln
