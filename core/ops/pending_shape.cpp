// Placeholders for the shape ops not written yet: each throws. The owner of
// core/ops/shape.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor cat(const std::vector<Tensor>&, int64_t) { KILN_THROW("cat: not implemented yet"); }
Tensor stack(const std::vector<Tensor>&, int64_t) { KILN_THROW("stack: not implemented yet"); }
std::vector<Tensor> split(const Tensor&, int64_t, int64_t) { KILN_THROW("split: not implemented yet"); }
std::vector<Tensor> split(const Tensor&, const std::vector<int64_t>&, int64_t) { KILN_THROW("split: not implemented yet"); }
std::vector<Tensor> chunk(const Tensor&, int64_t, int64_t) { KILN_THROW("chunk: not implemented yet"); }

}  // namespace kiln
