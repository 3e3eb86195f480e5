// CUDA random kernels: one thread per Philox counter (four 32-bit words) in
// a grid-stride loop, reading the same words per element as the CPU kernels
// (kernels/random.h) and converting through the same host/device transforms
// (kiln::Half / kiln::BFloat16 conversions included), so values match the CPU
// bit for bit whatever the launch configuration.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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

// Four consecutive elements (one Philox counter's) as one access: 8 bytes of
// 16-bit values, 16 of float, 32 of double (two 16-byte accesses). The
// callers use these only where the base pointer is aligned to the quad's size.
template <typename T>
__device__ __forceinline__ void load_quad(const T* p, T (&v)[4]) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8);
  if constexpr (sizeof(T) == 2) {
    const uint2 bits = *reinterpret_cast<const uint2*>(p);
    memcpy(v, &bits, sizeof(bits));
  } else if constexpr (sizeof(T) == 4) {
    const uint4 bits = *reinterpret_cast<const uint4*>(p);
    memcpy(v, &bits, sizeof(bits));
  } else {
    const uint4 low = reinterpret_cast<const uint4*>(p)[0], high = reinterpret_cast<const uint4*>(p)[1];
    memcpy(v, &low, sizeof(low));
    memcpy(v + 2, &high, sizeof(high));
  }
}

template <typename T>
__device__ __forceinline__ void store_quad(T* p, const T (&v)[4]) {
  if constexpr (sizeof(T) == 2) {
    uint2 bits;
    memcpy(&bits, v, sizeof(bits));
    *reinterpret_cast<uint2*>(p) = bits;
  } else if constexpr (sizeof(T) == 4) {
    uint4 bits;
    memcpy(&bits, v, sizeof(bits));
    *reinterpret_cast<uint4*>(p) = bits;
  } else {
    uint4 low, high;
    memcpy(&low, v, sizeof(low));
    memcpy(&high, v + 2, sizeof(high));
    reinterpret_cast<uint4*>(p)[0] = low;
    reinterpret_cast<uint4*>(p)[1] = high;
  }
}

// x * scale rounded once: never contracted into an FMA, so the product equals the CPU's.
template <typename T>
__device__ __forceinline__ T dropped_value(T x, bool keep, compute_t<T> scale) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<C, double>) {
    return keep ? T(__dmul_rn(static_cast<C>(x), scale)) : T(C(0));
  } else {
    return keep ? T(__fmul_rn(static_cast<C>(x), scale)) : T(C(0));
  }
}

// One thread per Philox counter: its four words decide four consecutive
// elements. `quads`: x, out (and mask, 4 bytes) are aligned for whole-quad
// accesses, so a full quad moves as one load, one store and one 4-byte mask
// store instead of four of each (the byte floor: read x, write out and mask).
template <typename T>
__global__ void dropout_kernel(const T* x, T* out, uint8_t* mask, int64_t count, int64_t counters, float p,
                               compute_t<T> scale, uint64_t seed, uint64_t offset, bool quads,
                               const philox::ReplayState* replay) {
  seed = philox::seed_of(seed, replay);
  offset = philox::offset_of(offset, replay);
  KILN_GRID_STRIDE(c, counters) {
    const philox::Uint4 w = philox::philox4x32(seed, offset + static_cast<uint64_t>(c));
    const int64_t first = 4 * c;
    if (quads && first + 3 < count) {
      T in[4], result[4];
      load_quad(x + first, in);
      uint32_t keep_bytes = 0;  // little-endian: byte `lane` is element first + lane's mask
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        const bool keep = dropout_keep(philox::lane(w, lane), p);
        result[lane] = dropped_value(in[lane], keep, scale);
        keep_bytes |= static_cast<uint32_t>(keep) << (8 * lane);
      }
      store_quad(out + first, result);
      if (mask != nullptr) *reinterpret_cast<uint32_t*>(mask + first) = keep_bytes;
      continue;
    }
    for (int lane = 0; lane < 4 && first + lane < count; ++lane) {
      const int64_t i = first + lane;
      const bool keep = dropout_keep(philox::lane(w, lane), p);
      out[i] = dropped_value(x[i], keep, scale);
      if (mask != nullptr) mask[i] = keep ? 1 : 0;
    }
  }
}

// dx = mask ? dout * scale : 0, four elements per thread (quads as above).
template <typename T>
__global__ void dropout_backward_kernel(const T* dout, const uint8_t* mask, T* dx, int64_t count, compute_t<T> scale,
                                        bool quads) {
  KILN_GRID_STRIDE(q, (count + 3) / 4) {
    const int64_t first = 4 * q;
    if (quads && first + 3 < count) {
      T in[4], result[4];
      load_quad(dout + first, in);
      const uint32_t keep_bytes = *reinterpret_cast<const uint32_t*>(mask + first);
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        result[lane] = dropped_value(in[lane], ((keep_bytes >> (8 * lane)) & 0xffu) != 0, scale);
      }
      store_quad(dx + first, result);
      continue;
    }
    for (int64_t i = first; i < first + 4 && i < count; ++i) dx[i] = dropped_value(dout[i], mask[i] != 0, scale);
  }
}

// Whether every pointer allows whole-quad accesses of T (and 4-byte mask words).
template <typename T>
bool quad_aligned(const void* a, const void* b, const uint8_t* mask) {
  const auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return aligned(a, 4 * sizeof(T)) && aligned(b, 4 * sizeof(T)) && (mask == nullptr || aligned(mask, 4));
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
        static_cast<compute_t<T>>(scale), seed, offset, quad_aligned<T>(x, out, mask), replay);
    cuda::check_last_launch("dropout (dropout_kernel)");
  });
}

void dropout_backward_cuda(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count, double scale,
                           cuda::Stream stream) {
  if (count == 0) return;
  dispatch_floating(dtype, "dropout backward", [&]<typename T>() {
    dropout_backward_kernel<T><<<blocks_for(static_cast<uint64_t>((count + 3) / 4)), kThreads, 0, native(stream)>>>(
        static_cast<const T*>(dout), mask, static_cast<T*>(dx), count, static_cast<compute_t<T>>(scale),
        quad_aligned<T>(dout, dx, mask));
    cuda::check_last_launch("dropout backward (dropout_backward_kernel)");
  });
}

}  // namespace kiln::kernels
