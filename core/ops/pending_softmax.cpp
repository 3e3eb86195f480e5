// Placeholders for the softmax ops not written yet: each throws. The owner of
// core/ops/softmax.cpp removes an entry when the real op lands, and this file
// when none is left.
#include "core/ops.h"

namespace kiln {

Tensor softmax(const Tensor&, int64_t) { KILN_THROW("softmax: not implemented yet"); }
Tensor log_softmax(const Tensor&, int64_t) { KILN_THROW("log_softmax: not implemented yet"); }
Tensor cross_entropy(const Tensor&, const Tensor&, const Tensor&, int64_t, double, Reduction) { KILN_THROW("cross_entropy: not implemented yet"); }
Tensor nll_loss(const Tensor&, const Tensor&, const Tensor&, int64_t, Reduction) { KILN_THROW("nll_loss: not implemented yet"); }

}  // namespace kiln
