// CPU top-k (kernels/sort.h): per row, a partial sort of the indices by
// (value, then index), rows split across threads.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/sort.h"

namespace kiln::kernels {

namespace {

// NaN above every number, as torch's topk.
template <typename C>
bool greater_or_nan(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (std::isnan(a)) return !std::isnan(b);
    if (std::isnan(b)) return false;
  }
  return a > b;
}

template <typename T>
void topk_rows(const TopkArgs& args) {
  using C = compute_t<T>;
  const auto* x = static_cast<const T*>(args.x);
  auto* values = static_cast<T*>(args.values);
#pragma omp parallel for schedule(static) if (args.rows > 1 && args.rows * args.cols > (1 << 16))
  for (int64_t row = 0; row < args.rows; ++row) {
    const T* in = x + row * args.cols;
    std::vector<int64_t> order(static_cast<size_t>(args.cols));
    std::iota(order.begin(), order.end(), int64_t{0});
    const auto before = [&](int64_t a, int64_t b) {
      const C va = static_cast<C>(in[a]), vb = static_cast<C>(in[b]);
      const bool a_first = args.largest ? greater_or_nan(va, vb) : greater_or_nan(vb, va);
      const bool b_first = args.largest ? greater_or_nan(vb, va) : greater_or_nan(va, vb);
      return a_first || (!b_first && a < b);  // ties: the lower index first
    };
    std::partial_sort(order.begin(), order.begin() + args.k, order.end(), before);
    for (int64_t j = 0; j < args.k; ++j) {
      values[row * args.k + j] = in[order[static_cast<size_t>(j)]];
      args.indices[row * args.k + j] = order[static_cast<size_t>(j)];
    }
  }
}

}  // namespace

void topk_cpu(const TopkArgs& args) {
  dispatch_all(args.dtype, "topk", [&]<typename T>() {
    if constexpr (std::is_same_v<T, bool>) {
      KILN_THROW("topk: bool tensors are not supported");
    } else {
      topk_rows<T>(args);
    }
  });
}

}  // namespace kiln::kernels
