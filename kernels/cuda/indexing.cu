// CUDA gather and scatter-add along one dim (see kernels/indexing.h).
//
// Invariants:
//  - Nothing here synchronizes except index_error_cuda(). An out-of-range
//    index is skipped (gather writes 0) and the first bad value is recorded in
//    a per-device error slot (a __device__ global: each device has its own).
//  - gather moves bytes, so it is instantiated per element size, not per dtype.
//  - scatter_add_cuda adds with atomics (order of float additions varies).
//    The *_sorted paths are deterministic: a stable radix sort of destination
//    keys (value = position in the index), then one thread per destination
//    element (index_add over wide rows: a warp per destination row) sums its
//    run in index order, in float for 16-bit types, and adds once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/indexing.h"
#include "kernels/cuda/native_types.cuh"

namespace kiln::kernels {

namespace {

constexpr int kThreads = 256;
// Grid-stride loops cover the rest; 2^20 blocks of 256 keep every GPU busy.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)); }

// ---------------------------------------------------------------- error slot

struct DeviceIndexError {
  int found;
  long long value;
  long long size;
};
__device__ DeviceIndexError g_index_error;

__device__ __forceinline__ void report_bad_index(long long value, long long size) {
  if (atomicCAS(&g_index_error.found, 0, 1) == 0) {
    g_index_error.value = value;
    g_index_error.size = size;
  }
}

// ---------------------------------------------------------------- types

template <typename T>
__device__ __forceinline__ void atomic_add(T* target, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(target), static_cast<unsigned long long>(value));
  } else if constexpr (std::is_same_v<T, int32_t>) {
    atomicAdd(reinterpret_cast<int*>(target), static_cast<int>(value));
  } else {
    atomicAdd(target, value);  // float, double, __half, __nv_bfloat16 (sm_80+)
  }
}

// Scatter dtypes: floating, int32, int64 (the front ends reject the others).
template <typename Fn>
void dispatch_scatter(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<__half>();
    case DType::bf16: return fn.template operator()<__nv_bfloat16>();
    case DType::i32: return fn.template operator()<int32_t>();
    case DType::i64: return fn.template operator()<int64_t>();
    default: break;
  }
  KILN_THROW("scatter_add: unsupported dtype ", dtype_name(dtype), " (expected a floating dtype, int32 or int64)");
}

template <typename Fn>
void dispatch_floating_native(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::f32: return fn.template operator()<float>();
    case DType::f64: return fn.template operator()<double>();
    case DType::f16: return fn.template operator()<__half>();
    case DType::bf16: return fn.template operator()<__nv_bfloat16>();
    default: break;
  }
  KILN_THROW(op, ": the deterministic CUDA path expects a floating dtype, got ", dtype_name(dtype));
}

// ---------------------------------------------------------------- geometry

// The iteration with the indexed dim folded into the index value: data's
// stride along dim is zeroed (each element adds index * dim_stride instead),
// after which adjacent dims coalesce freely. Operands: data, index, values.
struct Flat {
  IterShape shape;
  Operand ops[3];
  int64_t dim_stride;
  int64_t dim_size;
};

Flat flatten_args(const IndexArgs& args) {
  Flat flat;
  flat.shape = args.shape;
  flat.ops[0] = args.data;
  flat.ops[1] = args.index;
  flat.ops[2] = args.values;
  flat.dim_stride = args.data.strides[args.dim];
  flat.dim_size = args.data_dim_size;
  flat.ops[0].strides[args.dim] = 0;
  coalesce(flat.shape, flat.ops, 3);
  return flat;
}

template <typename I>
__device__ __forceinline__ bool load_index(const I* index, int64_t offset, int64_t size, int64_t* at) {
  *at = static_cast<int64_t>(index[offset]);
  if (*at < 0 || *at >= size) [[unlikely]] {
    report_bad_index(*at, size);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------- gather

template <typename T, typename I>
__global__ void gather_kernel(Flat flat, int64_t n) {
  const T* data = static_cast<const T*>(flat.ops[0].data);
  const I* index = static_cast<const I*>(flat.ops[1].data);
  T* values = static_cast<T*>(flat.ops[2].data);
  for (int64_t linear = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; linear < n;
       linear += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[3];
    offsets_of(linear, flat.shape, flat.ops, 3, offsets);
    int64_t at;
    values[offsets[2]] = load_index(index, offsets[1], flat.dim_size, &at) ? data[offsets[0] + at * flat.dim_stride]
                                                                           : T{};
  }
}

// ---------------------------------------------------------------- atomic scatter

template <typename T, typename I>
__global__ void scatter_add_atomic_kernel(Flat flat, int64_t n) {
  T* data = static_cast<T*>(flat.ops[0].data);
  const I* index = static_cast<const I*>(flat.ops[1].data);
  const T* values = static_cast<const T*>(flat.ops[2].data);
  for (int64_t linear = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; linear < n;
       linear += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[3];
    offsets_of(linear, flat.shape, flat.ops, 3, offsets);
    int64_t at;
    if (load_index(index, offsets[1], flat.dim_size, &at)) {
      atomic_add(data + offsets[0] + at * flat.dim_stride, values[offsets[2]]);
    }
  }
}

// ---------------------------------------------------------------- sorted scatter

// Workspace: keys in/out (uint64), positions in/out (int64), then CUB's temp.
struct SortBuffers {
  uint64_t* keys_in;
  uint64_t* keys_out;
  int64_t* positions_in;
  int64_t* positions_out;
  void* temp;
  size_t temp_bytes;
};

size_t align_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t sort_temp_bytes(int64_t count, int end_bit) {
  size_t bytes = 0;
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint64_t*>(nullptr),
                                                  static_cast<uint64_t*>(nullptr), static_cast<const int64_t*>(nullptr),
                                                  static_cast<int64_t*>(nullptr), count, 0, end_bit));
  return bytes;
}

size_t sort_workspace_bytes(int64_t count) {
  return 4 * align_up(static_cast<size_t>(count) * 8) + align_up(sort_temp_bytes(count, 64));
}

SortBuffers carve(void* workspace, size_t workspace_bytes, int64_t count, const char* op) {
  char* base = static_cast<char*>(workspace);
  const size_t array_bytes = align_up(static_cast<size_t>(count) * 8);
  KILN_ASSERT(workspace_bytes >= 4 * array_bytes, op, ": workspace of ", workspace_bytes, " bytes is too small");
  SortBuffers buffers;
  buffers.keys_in = reinterpret_cast<uint64_t*>(base);
  buffers.keys_out = reinterpret_cast<uint64_t*>(base + array_bytes);
  buffers.positions_in = reinterpret_cast<int64_t*>(base + 2 * array_bytes);
  buffers.positions_out = reinterpret_cast<int64_t*>(base + 3 * array_bytes);
  buffers.temp = base + 4 * array_bytes;
  buffers.temp_bytes = workspace_bytes - 4 * array_bytes;
  return buffers;
}

// Bits needed for keys in [0, sentinel].
int key_bits(uint64_t sentinel) {
  int bits = 1;
  while (bits < 64 && (sentinel >> bits) != 0) ++bits;
  return bits;
}

void sort_keys(SortBuffers& buffers, int64_t count, uint64_t sentinel, cuda::Stream stream, const char* op) {
  const int end_bit = key_bits(sentinel);
  KILN_ASSERT(sort_temp_bytes(count, end_bit) <= buffers.temp_bytes, op, ": sort workspace is too small");
  KILN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(buffers.temp, buffers.temp_bytes, buffers.keys_in,
                                                  buffers.keys_out, buffers.positions_in, buffers.positions_out,
                                                  count, 0, end_bit, static_cast<cudaStream_t>(stream)));
}

// Keys are destination element offsets; an out-of-range index gets `sentinel`.
template <typename I>
__global__ void scatter_keys_kernel(Flat flat, int64_t n, uint64_t sentinel, uint64_t* keys, int64_t* positions) {
  const I* index = static_cast<const I*>(flat.ops[1].data);
  for (int64_t linear = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; linear < n;
       linear += int64_t{gridDim.x} * blockDim.x) {
    int64_t offsets[3];
    offsets_of(linear, flat.shape, flat.ops, 3, offsets);
    int64_t at;
    keys[linear] = load_index(index, offsets[1], flat.dim_size, &at)
                       ? static_cast<uint64_t>(offsets[0] + at * flat.dim_stride)
                       : sentinel;
    positions[linear] = linear;
  }
}

// One thread per sorted position; the first of each run sums the run.
template <typename T>
__global__ void scatter_runs_kernel(Flat flat, int64_t n, uint64_t sentinel, const uint64_t* keys,
                                    const int64_t* positions) {
  T* data = static_cast<T*>(flat.ops[0].data);
  const T* values = static_cast<const T*>(flat.ops[2].data);
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < n; p += int64_t{gridDim.x} * blockDim.x) {
    const uint64_t key = keys[p];
    if (key == sentinel || (p > 0 && keys[p - 1] == key)) continue;
    typename Acc<T>::type sum = 0;
    for (int64_t q = p; q < n && keys[q] == key; ++q) {
      int64_t offsets[3];
      offsets_of(positions[q], flat.shape, flat.ops, 3, offsets);
      sum += to_acc(values[offsets[2]]);
    }
    data[key] = from_acc<T>(to_acc(data[key]) + sum);
  }
}

// ---------------------------------------------------------------- sorted index_add

template <typename I>
__global__ void index_keys_kernel(const I* index, int64_t count, int64_t size, uint64_t* keys, int64_t* positions) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < count;
       p += int64_t{gridDim.x} * blockDim.x) {
    int64_t at;
    keys[p] = load_index(index, p, size, &at) ? static_cast<uint64_t>(at) : static_cast<uint64_t>(size);
    positions[p] = p;
  }
}

// Thread t covers (sorted position p, outer a, inner b), b fastest so that a
// warp reads contiguous rows of `values`.
template <typename T>
__global__ void index_add_runs_kernel(T* data, const T* values, const uint64_t* keys, const int64_t* positions,
                                      int64_t outer, int64_t count, int64_t inner, int64_t size) {
  const int64_t n = count * outer * inner;
  for (int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; t < n; t += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = t % inner;
    const int64_t a = (t / inner) % outer;
    const int64_t p = t / (inner * outer);
    const uint64_t key = keys[p];
    if (key == static_cast<uint64_t>(size) || (p > 0 && keys[p - 1] == key)) continue;
    typename Acc<T>::type sum = 0;
    for (int64_t q = p; q < count && keys[q] == key; ++q) sum += to_acc(values[(a * count + positions[q]) * inner + b]);
    T& target = data[(a * size + static_cast<int64_t>(key)) * inner + b];
    target = from_acc<T>(to_acc(target) + sum);
  }
}

// The same sums for rows of at least kRowAddMin elements (an embedding's
// backward: inner = the embedding width): one warp per (outer, sorted
// position) that starts a run, its lanes across the row, kVec elements per
// lane as one 16-byte access when the rows allow (kVec = 1 otherwise), the
// run's key and positions read once per warp instead of once per element, no
// 64-bit division per element. Each element gets index_add_runs_kernel's
// arithmetic in the same order (the same bits).
constexpr int64_t kRowAddMin = 32;

template <typename T, int kVec>
__global__ void index_add_rows_kernel(T* data, const T* values, const uint64_t* keys, const int64_t* positions,
                                      int64_t outer, int64_t count, int64_t inner, int64_t size) {
  using A = typename Acc<T>::type;
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  const int64_t warps = int64_t{gridDim.x} * warps_per_block;
  for (int64_t row = int64_t{blockIdx.x} * warps_per_block + threadIdx.x / 32; row < outer * count; row += warps) {
    const int64_t a = row / count, p = row % count;
    const uint64_t key = keys[p];  // the whole warp reads the same keys: broadcasts
    if (key == static_cast<uint64_t>(size) || (p > 0 && keys[p - 1] == key)) continue;
    int64_t end = p + 1;
    while (end < count && keys[end] == key) ++end;
    T* target = data + (a * size + static_cast<int64_t>(key)) * inner;
    const T* source = values + a * count * inner;
    for (int64_t b = int64_t{lane} * kVec; b < inner; b += 32 * kVec) {
      A sum[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum[k] = A(0);
      for (int64_t q = p; q < end; ++q) {
        alignas(16) T chunk[kVec];
        const T* from = source + positions[q] * inner + b;
        if constexpr (kVec > 1) {
          *reinterpret_cast<uint4*>(chunk) = *reinterpret_cast<const uint4*>(from);
        } else {
          chunk[0] = *from;
        }
#pragma unroll
        for (int k = 0; k < kVec; ++k) sum[k] += to_acc(chunk[k]);
      }
      alignas(16) T out[kVec];
      if constexpr (kVec > 1) {
        *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(target + b);
      } else {
        out[0] = target[b];
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) out[k] = from_acc<T>(to_acc(out[k]) + sum[k]);
      if constexpr (kVec > 1) {
        *reinterpret_cast<uint4*>(target + b) = *reinterpret_cast<const uint4*>(out);
      } else {
        target[b] = out[0];
      }
    }
  }
}

// index_select and embedding: the flattened iteration's last dim is a row
// contiguous in data and values, with one index per row (index stride 0
// there). One warp per row reads the index once and copies the row, in
// 16-byte vectors when every row start is 16-byte aligned (RowGather), so
// that an embedding lookup moves memory at copy speed instead of one element
// (and one index load and check) per thread. A bad index zero-fills its row.
// Compiled, not yet run on a GPU: test_indexing's [gpu] cases check it.
struct RowGather {
  bool rows = false;     // the layout above
  bool vectors = false;  // rows copied as uint4
  int64_t row_length = 0, row_count = 0;
};

// One warp copies a row of n elements (or zeros, when !ok): each lane loads
// up to kRowLoadsInFlight elements before it stores any, so that a row of
// GPT-2's width (768: 3 16-byte vectors a lane in bfloat16, 6 in float32)
// costs one memory latency instead of one per element (the compiler keeps
// the loads after each store otherwise: src and dst may alias for all it knows).
constexpr int kRowLoadsInFlight = 4;

template <typename V>
__device__ __forceinline__ void copy_row_in_flight(const V* src, V* dst, int64_t n, bool ok, int lane, V zero) {
  for (int64_t first = lane; first < n; first += 32 * kRowLoadsInFlight) {
    V values[kRowLoadsInFlight];
#pragma unroll
    for (int u = 0; u < kRowLoadsInFlight; ++u) {
      const int64_t j = first + 32 * u;
      values[u] = ok && j < n ? src[j] : zero;
    }
#pragma unroll
    for (int u = 0; u < kRowLoadsInFlight; ++u) {
      const int64_t j = first + 32 * u;
      if (j < n) dst[j] = values[u];
    }
  }
}

template <typename T, typename I>
__global__ void gather_rows_kernel(Flat flat, RowGather rows) {
  const T* data = static_cast<const T*>(flat.ops[0].data);
  const I* index = static_cast<const I*>(flat.ops[1].data);
  T* values = static_cast<T*>(flat.ops[2].data);
  const int lane = threadIdx.x % 32, warps_per_block = blockDim.x / 32;
  const int64_t warps = int64_t{gridDim.x} * warps_per_block;
  for (int64_t row = int64_t{blockIdx.x} * warps_per_block + threadIdx.x / 32; row < rows.row_count; row += warps) {
    int64_t offsets[3];
    offsets_of(row * rows.row_length, flat.shape, flat.ops, 3, offsets);
    int64_t at = 0;
    const bool ok = load_index(index, offsets[1], flat.dim_size, &at);  // every lane: one broadcast load
    const T* src = data + offsets[0] + (ok ? at : 0) * flat.dim_stride;
    T* dst = values + offsets[2];
    if (rows.vectors) {
      constexpr int kVec = 16 / static_cast<int>(sizeof(T));
      const int64_t chunks = rows.row_length / kVec;
      const auto* src_vectors = reinterpret_cast<const uint4*>(src);
      auto* dst_vectors = reinterpret_cast<uint4*>(dst);
      copy_row_in_flight(src_vectors, dst_vectors, chunks, ok, lane, make_uint4(0, 0, 0, 0));
    } else {
      copy_row_in_flight(src, dst, rows.row_length, ok, lane, T{});
    }
  }
}

RowGather row_gather(const Flat& flat, size_t element, const IndexArgs& args) {
  RowGather rows;
  const int last = flat.shape.ndim - 1;
  if (last < 0 || flat.ops[0].strides[last] != 1 || flat.ops[2].strides[last] != 1 || flat.ops[1].strides[last] != 0) {
    return rows;
  }
  rows.row_length = flat.shape.sizes[last];
  if (rows.row_length < 8) return rows;  // short rows: one element per thread is as good
  rows.rows = true;
  rows.row_count = flat.shape.numel() / rows.row_length;
  // Every row start aligned: the bases, the indexed stride and the outer strides of data and values.
  auto aligned = [&](int64_t elements) { return (static_cast<size_t>(elements) * element) % 16 == 0; };
  rows.vectors = aligned(rows.row_length) && aligned(flat.dim_stride) &&
                 reinterpret_cast<uintptr_t>(args.data.data) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(args.values.data) % 16 == 0;
  for (int d = 0; d < last; ++d) rows.vectors = rows.vectors && aligned(flat.ops[0].strides[d]) && aligned(flat.ops[2].strides[d]);
  return rows;
}

}  // namespace

void gather_cuda(const IndexArgs& args, cuda::Stream stream) {
  const int64_t n = args.shape.numel();
  if (n == 0) return;
  const Flat flat = flatten_args(args);
  const RowGather rows = row_gather(flat, dtype_size(args.data.dtype), args);
  auto launch = [&]<typename T>() {
    dispatch_index(args.index.dtype, "gather", [&]<typename I>() {
      if (rows.rows) {
        constexpr int64_t kWarpsPerBlock = kThreads / 32;
        const auto blocks = static_cast<int>(std::min<int64_t>((rows.row_count + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
        gather_rows_kernel<T, I><<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(flat, rows);
        cuda::check_last_launch("gather_rows_kernel");
        return;
      }
      gather_kernel<T, I><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(flat, n);
      cuda::check_last_launch("gather_kernel");
    });
  };
  switch (dtype_size(args.data.dtype)) {
    case 1: return launch.template operator()<uint8_t>();
    case 2: return launch.template operator()<uint16_t>();
    case 4: return launch.template operator()<uint32_t>();
    case 8: return launch.template operator()<uint64_t>();
    default: KILN_THROW("gather: unsupported dtype ", dtype_name(args.data.dtype));
  }
}

void scatter_add_cuda(const IndexArgs& args, cuda::Stream stream) {
  const int64_t n = args.shape.numel();
  if (n == 0) return;
  const Flat flat = flatten_args(args);
  dispatch_scatter(args.data.dtype, [&]<typename T>() {
    dispatch_index(args.index.dtype, "scatter_add", [&]<typename I>() {
      scatter_add_atomic_kernel<T, I><<<blocks_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(flat, n);
      cuda::check_last_launch("scatter_add_atomic_kernel");
    });
  });
}

size_t scatter_add_sorted_workspace_bytes(int64_t count) { return sort_workspace_bytes(count); }

void scatter_add_sorted_cuda(const IndexArgs& args, int64_t data_extent, void* workspace, size_t workspace_bytes,
                             cuda::Stream stream) {
  const int64_t n = args.shape.numel();
  if (n == 0) return;
  const Flat flat = flatten_args(args);
  const uint64_t sentinel = static_cast<uint64_t>(data_extent);
  SortBuffers buffers = carve(workspace, workspace_bytes, n, "scatter_add");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  dispatch_index(args.index.dtype, "scatter_add", [&]<typename I>() {
    scatter_keys_kernel<I><<<blocks_for(n), kThreads, 0, cuda_stream>>>(flat, n, sentinel, buffers.keys_in,
                                                                         buffers.positions_in);
    cuda::check_last_launch("scatter_keys_kernel");
  });
  sort_keys(buffers, n, sentinel, stream, "scatter_add");
  dispatch_floating_native(args.data.dtype, "scatter_add", [&]<typename T>() {
    scatter_runs_kernel<T><<<blocks_for(n), kThreads, 0, cuda_stream>>>(flat, n, sentinel, buffers.keys_out,
                                                                         buffers.positions_out);
    cuda::check_last_launch("scatter_runs_kernel");
  });
}

size_t index_add_sorted_workspace_bytes(int64_t count) { return sort_workspace_bytes(count); }

void index_add_sorted_cuda(const IndexAddArgs& args, void* workspace, size_t workspace_bytes, cuda::Stream stream) {
  if (args.count == 0 || args.outer == 0 || args.inner == 0) return;
  SortBuffers buffers = carve(workspace, workspace_bytes, args.count, "index_add");
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  dispatch_index(args.index_dtype, "index_add", [&]<typename I>() {
    index_keys_kernel<I><<<blocks_for(args.count), kThreads, 0, cuda_stream>>>(
        static_cast<const I*>(args.index), args.count, args.data_dim_size, buffers.keys_in, buffers.positions_in);
    cuda::check_last_launch("index_keys_kernel");
  });
  sort_keys(buffers, args.count, static_cast<uint64_t>(args.data_dim_size), stream, "index_add");
  const int64_t n = args.count * args.outer * args.inner;
  dispatch_floating_native(args.dtype, "index_add", [&]<typename T>() {
    auto* data = static_cast<T*>(args.data);
    const auto* values = static_cast<const T*>(args.values);
    if (args.inner < kRowAddMin) {
      index_add_runs_kernel<T><<<blocks_for(n), kThreads, 0, cuda_stream>>>(
          data, values, buffers.keys_out, buffers.positions_out, args.outer, args.count, args.inner,
          args.data_dim_size);
      cuda::check_last_launch("index_add_runs_kernel");
      return;
    }
    // Every row starts on 16 bytes when the bases do and a row is whole vectors.
    constexpr int kVec = 16 / static_cast<int>(sizeof(T));
    const bool vectors = args.inner % kVec == 0 && reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(values) % 16 == 0;
    const int blocks = blocks_for(args.outer * args.count * 32);  // a warp per row
    if (vectors) {
      index_add_rows_kernel<T, kVec><<<blocks, kThreads, 0, cuda_stream>>>(
          data, values, buffers.keys_out, buffers.positions_out, args.outer, args.count, args.inner,
          args.data_dim_size);
    } else {
      index_add_rows_kernel<T, 1><<<blocks, kThreads, 0, cuda_stream>>>(
          data, values, buffers.keys_out, buffers.positions_out, args.outer, args.count, args.inner,
          args.data_dim_size);
    }
    cuda::check_last_launch("index_add_rows_kernel");
  });
}

IndexError index_error_cuda(int device, cuda::Stream stream) {
  void* slot = nullptr;
  {
    cuda::DeviceGuard guard(device, "index_error_cuda");  // a __device__ symbol has one address per device
    KILN_CUDA_CHECK(cudaGetSymbolAddress(&slot, g_index_error));
  }
  DeviceIndexError host{};
  cuda::memcpy_async(&host, slot, sizeof(host), cuda::CopyKind::device_to_host, stream);
  cuda::stream_synchronize(stream);
  if (!host.found) return {};
  cuda::memset_async(slot, 0, sizeof(host), stream);
  return IndexError{true, host.value, host.size};
}

}  // namespace kiln::kernels
