// Reductions over a (outer, reduced, inner) view of a dense row-major buffer:
// the front end permutes and coalesces any set of reduced dims into this form
// (reduce the last dim: inner == 1; reduce a middle dim: inner > 1). Outputs
// are dense (outer, inner).
//
// Invariants:
//   - Accumulation: float for f16/bf16/f32, double for f64, int64 for integer
//     sums. Sums are pairwise on the CPU (fixed leaf blocks and fixed chunks),
//     block trees on CUDA: results never depend on the thread count, and CUDA
//     uses no atomics (a second pass combines chunk partials in fixed order).
//   - amax/amin/max/min propagate NaN; max/min indices pick the first index
//     among ties and the first NaN.
//   - reduced == 0 gives the identity (sum 0, mean NaN, all true, norm 0).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels {

enum class ReduceKind : uint8_t {
  sum,          // out = scale * sum(x); integer/bool inputs sum into int64 outputs
  mean,         // out = sum(x) / reduced
  var,          // out = sum((x - mean)^2) / max(reduced - correction, 0); aux (Acc) receives the mean
  amax,         // out = max(x)
  amin,         // out = min(x)
  norm,         // out = (sum |x|^p)^(1/p); p = 0 counts nonzeros, p = +-inf is max/min |x|
  all,          // out (bool) = every x != 0
  max_index,    // out = max(x), indices = its first index
  min_index,    // out = min(x), indices = its first index
  count_equal,  // out (Acc) = #{x == aux}           (backward of amax/amin)
  count_abs_equal,  // out (Acc) = #{|x| == aux}     (backward of the inf-norm)
};

// The accumulation dtype of floating `dtype` (float32, or float64 for float64).
inline constexpr DType reduce_acc_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

struct ReduceArgs {
  ReduceKind kind = ReduceKind::sum;
  DType in_dtype = DType::f32;
  DType out_dtype = DType::f32;  // as the front end chose (sum of integers: int64; all: bool; counts: Acc)
  const void* in = nullptr;      // (outer, reduced, inner) dense
  void* out = nullptr;           // (outer, inner) dense
  int64_t* indices = nullptr;    // (outer, inner), max_index / min_index only
  void* aux = nullptr;           // (outer, inner) of the Acc dtype: var writes the mean; count_* read the value
  int64_t outer = 1;
  int64_t reduced = 1;
  int64_t inner = 1;
  double p = 2.0;          // norm
  double scale = 1.0;      // sum
  int64_t correction = 1;  // var
  int device = 0;          // CUDA device of the buffers (reduce_cuda only)
};

// Runs a reduction on host memory. Throws kiln::Error for an unsupported dtype.
void reduce_cpu(const ReduceArgs& args);
// Device scratch that reduce_cuda needs for `args` (0 when none); the caller
// allocates it on the same device and passes it as `workspace`.
int64_t reduce_cuda_workspace_bytes(const ReduceArgs& args);
// Runs a reduction on device memory, asynchronously on `stream`.
void reduce_cuda(const ReduceArgs& args, void* workspace, cuda::Stream stream);

// Gradient of a reduction w.r.t. its input, elementwise over (outer, reduced,
// inner): dx = grad[o, i] * f(x[o, r, i], aux[o, i], count[o, i]).
enum class ReduceGradKind : uint8_t {
  scale,  // dx = grad * scale                                 (mean)
  var,    // dx = grad * scale * (x - aux)         aux = mean, scale = 2 / (n - correction)
  equal,  // dx = x == aux ? grad / count : 0      aux = amax/amin value, count = ties
  index,  // dx = r == indices ? grad : 0          (max/min over a dim)
  norm,   // dx = grad * d||x||_p / dx             aux = norm (count = ties for p = inf)
};

struct ReduceGradArgs {
  ReduceGradKind kind = ReduceGradKind::scale;
  DType dtype = DType::f32;        // x, grad and dx
  const void* x = nullptr;         // (outer, reduced, inner) dense
  const void* grad = nullptr;      // (outer, inner) dense, dtype
  const void* aux = nullptr;       // (outer, inner) dense, Acc dtype
  const void* count = nullptr;     // (outer, inner) dense, Acc dtype
  const int64_t* indices = nullptr;  // (outer, inner)
  void* dx = nullptr;              // (outer, reduced, inner) dense
  int64_t outer = 1;
  int64_t reduced = 1;
  int64_t inner = 1;
  double p = 2.0;
  double scale = 1.0;
};

void reduce_grad_cpu(const ReduceGradArgs& args);
void reduce_grad_cuda(const ReduceGradArgs& args, cuda::Stream stream);

// The p-norm's special cases, chosen once on the host so each gets its own
// kernel: fn.template operator()<NormClass>() for p.
enum NormClass { kNormZero, kNormOne, kNormTwo, kNormInf, kNormNegInf, kNormGeneral };
template <typename Fn>
void dispatch_norm_class(double p, Fn&& fn) {
  if (p == 0) {
    fn.template operator()<kNormZero>();
  } else if (p == 1) {
    fn.template operator()<kNormOne>();
  } else if (p == 2) {
    fn.template operator()<kNormTwo>();
  } else if (std::isinf(p)) {
    if (p > 0) {
      fn.template operator()<kNormInf>();
    } else {
      fn.template operator()<kNormNegInf>();
    }
  } else {
    fn.template operator()<kNormGeneral>();
  }
}

}  // namespace kiln::kernels
