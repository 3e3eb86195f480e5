// Division by a size fixed at launch, for kernels that split a flat index into
// coordinates: Div64 divides in 64 bits (any dividend, but a software routine
// of tens of instructions on the GPU), Div32 by FastDivmod (kernels/strided.h:
// a multiply-high and a shift, for dividends below 2^31). A kernel templated
// on the divider is launched with Div32 when every dividend it forms fits
// (fast_divide_fits) and with Div64 otherwise.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/strided.h"

namespace kiln::kernels {

struct Div64 {
  int64_t divisor = 1;
  __device__ __forceinline__ int64_t div(int64_t n) const { return n / divisor; }
  __device__ __forceinline__ int64_t value() const { return divisor; }
};

struct Div32 {
  FastDivmod divider;
  __device__ __forceinline__ int64_t div(int64_t n) const { return divider.div(static_cast<uint32_t>(n)); }
  __device__ __forceinline__ int64_t value() const { return divider.divisor; }
};

// The divider D of `divisor` (at least 1; at most 2^31 for Div32).
template <typename D>
D divider_for(int64_t divisor) {
  if constexpr (std::is_same_v<D, Div32>) {
    return Div32{FastDivmod(static_cast<uint32_t>(divisor))};
  } else {
    return Div64{divisor};
  }
}

// Whether a launch whose dividends are all below `bound` may take Div32
// (never while the tests force the 64-bit path: force_64bit_index_for_testing).
inline bool fast_divide_fits(int64_t bound) { return bound <= (int64_t{1} << 31) && !force_64bit_index(); }

// body.template operator()<Div32>() when `fast`, else body.template operator()<Div64>().
template <typename Body>
void dispatch_divider(bool fast, Body&& body) {
  if (fast) {
    body.template operator()<Div32>();
  } else {
    body.template operator()<Div64>();
  }
}

// (outer, middle, inner) coordinates of a flat index over sizes (outer, middle, inner).
template <typename D>
struct Split3 {
  D inner, middle;
  __device__ __forceinline__ void operator()(int64_t i, int64_t& outer_at, int64_t& middle_at, int64_t& inner_at) const {
    const int64_t rows = inner.div(i);
    inner_at = i - rows * inner.value();
    outer_at = middle.div(rows);
    middle_at = rows - outer_at * middle.value();
  }
};

template <typename D>
Split3<D> split3_for(int64_t middle, int64_t inner) {
  return {divider_for<D>(inner), divider_for<D>(middle)};
}

}  // namespace kiln::kernels
