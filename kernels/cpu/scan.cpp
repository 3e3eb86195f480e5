// CPU cumulative sums (kernels/scan.h): lines split across threads, each
// summed in order in the accumulation type.
#include <cstdint>
#include <type_traits>

#include "kernels/scan.h"

namespace kiln::kernels {

namespace {

template <typename T, typename Out>
void scan_lines(const ScanArgs& args) {
  using Acc = std::conditional_t<std::is_floating_point_v<compute_t<T>>, compute_t<T>, int64_t>;
  const auto* x = static_cast<const T*>(args.x);
  auto* out = static_cast<Out*>(args.out);
  const int64_t lines = args.outer * args.inner, length = args.length, inner = args.inner;
#pragma omp parallel for schedule(static) if (lines > 1 && lines * length > (1 << 16))
  for (int64_t line = 0; line < lines; ++line) {
    const int64_t o = line / inner, i = line % inner;
    const int64_t base = o * length * inner + i;
    Acc sum = 0;
    for (int64_t step = 0; step < length; ++step) {
      const int64_t l = args.reverse ? length - 1 - step : step;
      sum += static_cast<Acc>(static_cast<compute_t<T>>(x[base + l * inner]));
      out[base + l * inner] = static_cast<Out>(sum);
    }
  }
}

}  // namespace

void cumsum_cpu(const ScanArgs& args) {
  dispatch_all(args.dtype, "cumsum", [&]<typename T>() {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      scan_lines<T, T>(args);
    } else {
      scan_lines<T, int64_t>(args);
    }
  });
}

}  // namespace kiln::kernels
