// The CPU elementwise loop shared by kernels/cpu/elementwise*.cpp: one output
// and any number of inputs over a common (broadcast) iteration shape.
// Contiguous operands run as one flat loop that the compiler vectorizes;
// otherwise the innermost dim runs as a tight strided loop per row. OpenMP
// splits either loop when it is large; results do not depend on the thread
// count (every element is computed independently).
#pragma once

#include <array>
#include <tuple>
#include <utility>

#include "kernels/dtype.h"
#include "kernels/strided.h"

namespace kiln::kernels::cpu {

// Below this many elements a loop stays on one thread (spawning costs more).
constexpr int64_t kParallelGrain = int64_t{1} << 15;

template <typename Out, typename... In, typename F, size_t... I>
void elementwise_loop_impl(std::index_sequence<I...>, IterShape shape, Operand* operands, F f) {
  constexpr int count = 1 + static_cast<int>(sizeof...(In));
  coalesce(shape, operands, count);
  const int64_t n = shape.numel();
  if (n == 0) return;
  Out* out = static_cast<Out*>(operands[0].data);
  const std::tuple<const In*...> in(static_cast<const In*>(operands[I + 1].data)...);
  if (all_contiguous(shape, operands, count)) {
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      out[i] = static_cast<Out>(f(static_cast<compute_t<In>>(std::get<I>(in)[i])...));
    }
    return;
  }
  const int last = shape.ndim - 1;
  const int64_t inner = shape.sizes[last];
  const int64_t outer = n / inner;
  const int64_t out_step = operands[0].strides[last];
  [[maybe_unused]] const std::array<int64_t, sizeof...(In)> steps{operands[I + 1].strides[last]...};
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (int64_t row = 0; row < outer; ++row) {
    int64_t offsets[kMaxOperands];
    offsets_of(row * inner, shape, operands, count, offsets);
    Out* o = out + offsets[0];
    for (int64_t i = 0; i < inner; ++i) {
      o[i * out_step] =
          static_cast<Out>(f(static_cast<compute_t<In>>(std::get<I>(in)[offsets[I + 1] + i * steps[I]])...));
    }
  }
}

// operands[0] is the output, operands[1..] the inputs (one per In).
template <typename Out, typename... In, typename F>
void elementwise_loop(const IterShape& shape, const Operand* operands, F f) {
  Operand local[kMaxOperands];
  for (size_t k = 0; k <= sizeof...(In); ++k) local[k] = operands[k];
  elementwise_loop_impl<Out, In...>(std::index_sequence_for<In...>{}, shape, local, f);
}

}  // namespace kiln::kernels::cpu
