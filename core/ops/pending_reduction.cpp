// Placeholders for the reduction ops not written yet: each throws. The owner of
// core/ops/reduction.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor sum(const Tensor&, const std::vector<int64_t>&, bool) { KILN_THROW("sum: not implemented yet"); }
Tensor mean(const Tensor&, const std::vector<int64_t>&, bool) { KILN_THROW("mean: not implemented yet"); }
Tensor var(const Tensor&, const std::vector<int64_t>&, int64_t, bool) { KILN_THROW("var: not implemented yet"); }
Tensor amax(const Tensor&, const std::vector<int64_t>&, bool) { KILN_THROW("amax: not implemented yet"); }
Tensor amin(const Tensor&, const std::vector<int64_t>&, bool) { KILN_THROW("amin: not implemented yet"); }
ValuesIndices max(const Tensor&, int64_t, bool) { KILN_THROW("max: not implemented yet"); }
ValuesIndices min(const Tensor&, int64_t, bool) { KILN_THROW("min: not implemented yet"); }
Tensor max(const Tensor& x);  // over all elements Tensor min(const Tensor&) { KILN_THROW("max: not implemented yet"); }
Tensor argmax(const Tensor&, int64_t, bool) { KILN_THROW("argmax: not implemented yet"); }
Tensor norm(const Tensor&, double, const std::vector<int64_t>&, bool) { KILN_THROW("norm: not implemented yet"); }
Tensor all(const Tensor&) { KILN_THROW("all: not implemented yet"); }

}  // namespace kiln
