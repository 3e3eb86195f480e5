// CUDA random kernels: one thread per Philox counter (four 32-bit words) in
// a grid-stride loop, reading the same words per element as the CPU kernels
// (kernels/random.h) and converting through the same host/device transforms
// (kiln::Half / kiln::BFloat16 conversions included), so values match the CPU
// bit for bit whatever the launch configuration.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/random.h"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops cover the rest; 2^20 blocks of 256 keep every GPU busy.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int blocks_for(uint64_t n) {
  return static_cast<int>(std::min<int64_t>((static_cast<int64_t>(n) + kThreads - 1) / kThreads, kMaxBlocks));
}

cudaStream_t native(cuda::Stream stream) { return static_cast<cudaStream_t>(stream); }

#define KILN_GRID_STRIDE(c, n)                                                              \
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < (n); \
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <typename T>
__global__ void uniform_kernel(T* out, int64_t count, int64_t counters, uint64_t seed, uint64_t offset,
                               const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    for (int lane = 0; lane < 4 && 4 * c + lane < count; ++lane) out[4 * c + lane] = uniform_value<T>(philox::lane(w, lane));
  }
}

__global__ void uniform_double_kernel(double* out, int64_t count, int64_t counters, uint64_t seed, uint64_t offset,
                                      const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    out[2 * c] = philox::uniform_double(w.x, w.y);
    if (2 * c + 1 < count) out[2 * c + 1] = philox::uniform_double(w.z, w.w);
  }
}

template <typename T>
__global__ void normal_kernel(T* out, int64_t count, int64_t counters, uint64_t seed, uint64_t offset,
                              const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    out[2 * c] = normal_value<T>(w.x, w.y);
    if (2 * c + 1 < count) out[2 * c + 1] = normal_value<T>(w.z, w.w);
  }
}

__global__ void normal_double_kernel(double* out, int64_t counters, uint64_t seed, uint64_t offset,
                                     const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) { out[c] = normal_double(philox::philox4x32(seed, offset + static_cast<uint64_t>(c))); }
}

template <typename T>
__global__ void randint_kernel(T* out, int64_t count, int64_t counters, int64_t low, uint64_t range, uint64_t seed,
                               uint64_t offset, const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    out[2 * c] = static_cast<T>(static_cast<compute_t<T>>(randint_value(w.x, w.y, low, range)));
    if (2 * c + 1 < count) out[2 * c + 1] = static_cast<T>(static_cast<compute_t<T>>(randint_value(w.z, w.w, low, range)));
  }
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* out, uint8_t* mask, int64_t count, int64_t counters, float p,
                               compute_t<T> scale, uint64_t seed, uint64_t offset,
                               const philox::ReplayState* replay) {
  using C = compute_t<T>;
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    for (int lane = 0; lane < 4 && 4 * c + lane < count; ++lane) {
      const int64_t i = 4 * c + lane;
      const bool keep = dropout_keep(philox::lane(w, lane), p);
      // __fmul_rn: never contracted into an FMA, so the product equals the CPU's.
      if constexpr (std::is_same_v<C, double>) {
        out[i] = keep ? T(__dmul_rn(static_cast<C>(x[i]), scale)) : T(C(0));
      } else {
        out[i] = keep ? T(__fmul_rn(static_cast<C>(x[i]), scale)) : T(C(0));
      }
      if (mask != nullptr) mask[i] = keep ? 1 : 0;
    }
  }
}

template <typename T>
__global__ void dropout_backward_kernel(const T* dout, const uint8_t* mask, T* dx, int64_t count, compute_t<T> scale) {
  using C = compute_t<T>;
  KILN_GRID_STRIDE(i, count) {
    if constexpr (std::is_same_v<C, double>) {
      dx[i] = mask[i] ? T(__dmul_rn(static_cast<C>(dout[i]), scale)) : T(C(0));
    } else {
      dx[i] = mask[i] ? T(__fmul_rn(static_cast<C>(dout[i]), scale)) : T(C(0));
    }
  }
}

}  // namespace

void uniform_cuda(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset, cuda::Stream stream,
                  const philox::ReplayState* replay) {
  const uint64_t counters = uniform_counters(dtype, count);
  if (counters == 0) return;
  if (dtype == DType::f64) {
    uniform_double_kernel<<<blocks_for(counters), kThreads, 0, native(stream)>>>(
        static_cast<double*>(out), count, static_cast<int64_t>(counters), seed, offset, replay);
    cuda::check_last_launch("rand (uniform_double_kernel)");
    return;
  }
  dispatch_floating(dtype, "rand", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      uniform_kernel<T><<<blocks_for(counters), kThreads, 0, native(stream)>>>(
          static_cast<T*>(out), count, static_cast<int64_t>(counters), seed, offset, replay);
      cuda::check_last_launch("rand (uniform_kernel)");
    }
  });
}

void normal_cuda(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset, cuda::Stream stream,
                 const philox::ReplayState* replay) {
  const uint64_t counters = normal_counters(dtype, count);
  if (counters == 0) return;
  if (dtype == DType::f64) {
    normal_double_kernel<<<blocks_for(counters), kThreads, 0, native(stream)>>>(
        static_cast<double*>(out), static_cast<int64_t>(counters), seed, offset, replay);
    cuda::check_last_launch("randn (normal_double_kernel)");
    return;
  }
  dispatch_floating(dtype, "randn", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      normal_kernel<T><<<blocks_for(counters), kThreads, 0, native(stream)>>>(
          static_cast<T*>(out), count, static_cast<int64_t>(counters), seed, offset, replay);
      cuda::check_last_launch("randn (normal_kernel)");
    }
  });
}

void randint_cuda(void* out, DType dtype, int64_t count, int64_t low, uint64_t range, uint64_t seed,
                  uint64_t offset, cuda::Stream stream, const philox::ReplayState* replay) {
  KILN_CHECK(dtype != DType::b8, "randint: bool is not a supported dtype");
  const uint64_t counters = randint_counters(count);
  if (counters == 0) return;
  dispatch_all(dtype, "randint", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      randint_kernel<T><<<blocks_for(counters), kThreads, 0, native(stream)>>>(
          static_cast<T*>(out), count, static_cast<int64_t>(counters), low, range, seed, offset, replay);
      cuda::check_last_launch("randint (randint_kernel)");
    }
  });
}

void dropout_cuda(const void* x, void* out, uint8_t* mask, DType dtype, int64_t count, float p, double scale,
                  uint64_t seed, uint64_t offset, cuda::Stream stream, const philox::ReplayState* replay) {
  const uint64_t counters = dropout_counters(count);
  if (counters == 0) return;
  dispatch_floating(dtype, "dropout", [&]<typename T>() {
    dropout_kernel<T><<<blocks_for(counters), kThreads, 0, native(stream)>>>(
        static_cast<const T*>(x), static_cast<T*>(out), mask, count, static_cast<int64_t>(counters), p,
        static_cast<compute_t<T>>(scale), seed, offset, replay);
    cuda::check_last_launch("dropout (dropout_kernel)");
  });
}

void dropout_backward_cuda(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count, double scale,
                           cuda::Stream stream) {
  if (count == 0) return;
  dispatch_floating(dtype, "dropout backward", [&]<typename T>() {
    dropout_backward_kernel<T><<<blocks_for(static_cast<uint64_t>(count)), kThreads, 0, native(stream)>>>(
        static_cast<const T*>(dout), mask, static_cast<T*>(dx), count, static_cast<compute_t<T>>(scale));
    cuda::check_last_launch("dropout backward (dropout_backward_kernel)");
  });
}

}  // namespace kiln::kernels
