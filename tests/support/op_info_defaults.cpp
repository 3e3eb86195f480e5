// Weak empty defaults so the test binary links while a family has no rows
// yet; the family's tests/ops_<family>.cpp overrides its function. The
// "every op has a row" test fails until every family has filled its rows.
#include "tests/support/op_info.h"

namespace kiln::testing {

#define KILN_WEAK_ROWS(family) \
  __attribute__((weak)) std::vector<OpInfo> family##_op_infos() { return {}; }
KILN_WEAK_ROWS(elementwise)
KILN_WEAK_ROWS(reduction)
KILN_WEAK_ROWS(linalg)
KILN_WEAK_ROWS(softmax)
KILN_WEAK_ROWS(indexing)
KILN_WEAK_ROWS(shape)
KILN_WEAK_ROWS(view)
KILN_WEAK_ROWS(nn)
KILN_WEAK_ROWS(attention)
#undef KILN_WEAK_ROWS

}  // namespace kiln::testing
