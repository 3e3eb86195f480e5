// CPU tril / triu (kernels/triangular.h): matrices split across threads.
#include <cstring>

#include "kernels/triangular.h"

namespace kiln::kernels {

void triangular_cpu(const TriangularArgs& args) {
  dispatch_all(args.dtype, args.upper ? "triu" : "tril", [&]<typename T>() {
    const auto* x = static_cast<const T*>(args.x);
    auto* out = static_cast<T*>(args.out);
    const int64_t matrix = args.rows * args.cols;
#pragma omp parallel for schedule(static) if (args.batch > 1 && args.batch * matrix > (1 << 16))
    for (int64_t b = 0; b < args.batch; ++b) {
      for (int64_t r = 0; r < args.rows; ++r) {
        const int64_t at = b * matrix + r * args.cols;
        for (int64_t c = 0; c < args.cols; ++c) out[at + c] = triangular_keeps(args, r, c) ? x[at + c] : T(0);
      }
    }
  });
}

}  // namespace kiln::kernels
