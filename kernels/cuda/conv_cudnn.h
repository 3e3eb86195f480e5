// What kernels/cuda/conv.cpp (cuDNN's legacy convolution API) and
// kernels/cuda/conv_graph.cpp (its graph, or backend, API) share: the three
// directions of a convolution, the operands of one call, the cache key, the
// workspace bound, alpha and beta, the cuDNN data type. Internal to kernels/cuda.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <string>

#include "kernels/conv.h"

namespace kiln::kernels::cudnn_conv {

enum class Direction { forward, backward_data, backward_filter };

// Device pointers of one call: x (forward, backward filter), w (forward,
// backward data), dy (backward), out = y, dx or dw.
struct Operands {
  const void* x;
  const void* w;
  const void* dy;
  void* out;
};

// Everything a choice of kernel depends on: shapes, dtype, layout, the flags
// that restrict the choice, the operands' alignment (up to 16 bytes), the device.
struct Key {
  int direction;
  std::array<int64_t, 16> shape;
  int dtype;
  bool channels_last, deterministic, allow_tf32, benchmark;
  int alignment;
  int device;
  auto operator<=>(const Key&) const = default;
};

// The largest power of two up to 16 dividing every operand's address: a view
// at an odd offset may not take the vectorized kernel chosen for aligned ones.
inline int alignment_of(const Operands& ops) {
  uintptr_t bits = 16;
  for (const void* pointer : {ops.x, ops.w, ops.dy, static_cast<const void*>(ops.out)}) {
    if (pointer != nullptr) bits |= reinterpret_cast<uintptr_t>(pointer);
  }
  return static_cast<int>(bits & (~bits + 1));
}

inline Key make_key(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config, const Operands& ops) {
  return {static_cast<int>(direction),
          {p.batch, p.in_channels, p.in_h, p.in_w, p.out_channels, p.kernel_h, p.kernel_w, p.out_h, p.out_w,
           p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups},
          static_cast<int>(config.dtype),
          config.channels_last,
          config.deterministic,
          config.allow_tf32,
          config.benchmark,
          alignment_of(ops),
          config.device};
}

// Largest workspace a benchmark-mode search lets a candidate take (those
// needing more are skipped), as a bound on memory taken from training; the
// graph API also skips such plans without benchmark mode.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

// alpha = 1, beta = 0 in the type cuDNN expects (double for double data).
struct Scalars {
  double d_one = 1.0, d_zero = 0.0;
  float f_one = 1.0f, f_zero = 0.0f;
  bool is_double;
  explicit Scalars(DType dtype) : is_double(dtype == DType::f64) {}
  const void* one() const { return is_double ? static_cast<const void*>(&d_one) : &f_one; }
  const void* zero() const { return is_double ? static_cast<const void*>(&d_zero) : &f_zero; }
};

cudnnDataType_t data_type(DType dtype);
const char* direction_name(Direction direction);

// ---------------------------------------------------------------- graph API (conv_graph.cpp)

// Runs one convolution through cuDNN's graph API on `handle` (bound to
// config.stream). Returns "" when it ran; otherwise why no engine
// configuration could run it (then nothing was launched and the caller uses
// the legacy API). Plans are cached per key and handle; in benchmark mode a
// cache miss times the candidate plans (it synchronizes the stream).
std::string run_graph(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config, const Operands& ops,
                      cudnnHandle_t handle, const WorkspaceAllocator& allocate);

struct GraphCacheStats {
  uint64_t hits = 0, misses = 0, entries = 0;  // benchmark-mode lookups, as CudnnConvCacheStats
  uint64_t fallbacks = 0;                      // calls the graph API could not run (legacy ran them)
};
GraphCacheStats graph_cache_stats();
void graph_cache_clear();

// The tensor and convolution descriptors of the graph for one call, built and
// finalized without a handle (cuDNN needs no GPU for them): "" when cuDNN
// accepts them all, else the attribute it refused. For a CPU test.
std::string check_graph_descriptors(Direction direction, const Conv2dParams& p, const ConvCudaConfig& config,
                                    int alignment);

}  // namespace kiln::kernels::cudnn_conv
