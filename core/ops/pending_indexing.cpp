// Placeholders for the indexing ops not written yet: each throws. The owner of
// core/ops/indexing.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor index_select(const Tensor&, int64_t, const Tensor&) { KILN_THROW("index_select: not implemented yet"); }
Tensor gather(const Tensor&, int64_t, const Tensor&) { KILN_THROW("gather: not implemented yet"); }
Tensor scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { KILN_THROW("scatter_add: not implemented yet"); }
Tensor embedding(const Tensor&, const Tensor&) { KILN_THROW("embedding: not implemented yet"); }

}  // namespace kiln
