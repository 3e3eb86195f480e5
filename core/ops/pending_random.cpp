// Placeholders for the random ops not written yet: each throws. The owner of
// core/ops/random.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor dropout(const Tensor&, double, bool) { KILN_THROW("dropout: not implemented yet"); }
Tensor rand(const Shape&, const TensorOptions&) { KILN_THROW("rand: not implemented yet"); }
Tensor randn(const Shape&, const TensorOptions&) { KILN_THROW("randn: not implemented yet"); }
Tensor randint(int64_t, int64_t, const Shape&, const TensorOptions&) { KILN_THROW("randint: not implemented yet"); }
Tensor randperm(int64_t, const TensorOptions&) { KILN_THROW("randperm: not implemented yet"); }

}  // namespace kiln
