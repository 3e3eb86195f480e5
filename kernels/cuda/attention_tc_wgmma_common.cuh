// What attention_tc's wgmma kernels (attention_tc_wgmma.cu, the forward;
// attention_tc_wgmma_backward.cu, dK/dV and dQ) share: the 128-byte swizzled
// shared tiles that wgmma reads through descriptors, and their loads.
#pragma once
#include "kernels/cuda/attention_tc_common.cuh"
#include "kernels/cuda/attention_tc_wgmma_ptx.cuh"

namespace kiln::kernels::attention_tc {
namespace {

// The 128-byte swizzled layout (the PTX ISA's canonical "128B swizzling")
// of a (kRows, D) tile of 16-bit elements: D / 64 column blocks of (kRows,
// 64), each row 128 bytes, its 16-byte chunks permuted by the row's index
// mod 8 (chunk c at c ^ (r % 8)). The byte offset of 16-byte chunk c (of
// D / 8) of row r. K-major for K's rows (descriptor: 8-row groups 1024 bytes
// apart), MN-major for V's (the same, column blocks kRows * 128 bytes apart).
template <int kRows>
__device__ __forceinline__ int swizzled_offset(int r, int c) {
  return c / 8 * (kRows * 128) + r * 128 + ((c % 8) ^ (r % 8)) * 16;
}

// Rows [row0, row0 + kRows) of a (rows, D) matrix of row stride `ld` into a
// swizzled tile (load_tile's contract otherwise: cp.async when `async`,
// rows past `rows` zeroed, 32-bit offsets within the tile's rows).
template <int kRows, int D, int kThreads, typename T>
__device__ __forceinline__ void load_swizzled_tile(unsigned char* tile, const T* src, int64_t ld, int64_t row0,
                                                   int64_t rows, bool async) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "every thread copies the same number of chunks");
  const T* first = src + row0 * ld;
  const int ld32 = static_cast<int>(ld);
  const int rows_left = rows - row0 <= 0 ? 0 : rows - row0 >= kRows ? kRows : static_cast<int>(rows - row0);
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int c = it * kThreads + static_cast<int>(threadIdx.x);
    const int r = c / kChunks, chunk = c % kChunks;
    T* to = reinterpret_cast<T*>(tile + swizzled_offset<kRows>(r, chunk));
    const T* from = first + r * ld32 + chunk * 8;
    if (r >= rows_left) {
      *reinterpret_cast<uint4*>(to) = make_uint4(0, 0, 0, 0);
    } else if (async) {
      cp_async_16(to, from);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) to[e] = from[e];
    }
  }
}

// The dynamic shared memory from its first 1024-byte-aligned byte (the
// swizzle patterns start there; the kernels ask for 1024 bytes more).
__device__ __forceinline__ unsigned char* aligned_smem_base(unsigned char* smem) {
  return smem + (1024 - wgmma_smem_address(smem) % 1024) % 1024;
}

// Key block `block` (keys block kCols ..) of K and V into the swizzled tiles
// `to` (K) and `to + tile_bytes` (V): the wgmma forward's and dQ's K/V stages
// (the warp-specialized forward's producer has its own map, produce_kv_block).
template <int kCols, int D, int kThreads, typename T>
__device__ __forceinline__ void load_swizzled_kv_block(unsigned char* to, int tile_bytes, const T* k, const T* v,
                                                       int64_t block, const Params& p) {
  load_swizzled_tile<kCols, D, kThreads>(to, k, p.k_layout.row, block * kCols, p.kv_len, p.vector_loads);
  load_swizzled_tile<kCols, D, kThreads>(to + tile_bytes, v, p.v_layout.row, block * kCols, p.kv_len, p.vector_loads);
}

// The descriptor of 16 columns (k0 = 16 kk .. + 15) of a K-major swizzled
// (kRows, D) tile: 32 bytes into column block kk / 4; 8-row groups 1024 bytes
// apart. For A (rows = M) or B (rows = N) alike.
template <int kRows>
__device__ __forceinline__ uint64_t k_major_descriptor(const unsigned char* tile, int kk) {
  return make_descriptor(tile + kk / 4 * (kRows * 128) + kk % 4 * 32, 16, 1024);
}

// The descriptor of 16 rows (k = 16 kk .. + 15) of a swizzled (kRows, D) tile
// read MN-major (B(k, n) = tile(16 kk + k, n)): two 8-row groups 1024 bytes
// apart, column blocks of 64 kRows * 128 bytes apart.
template <int kRows>
__device__ __forceinline__ uint64_t mn_major_descriptor(const unsigned char* tile, int kk) {
  return make_descriptor(tile + kk * 16 * 128, kRows * 128, 1024);
}

// The products of the wgmma kernels, each issued (not waited for):
// d (64 x kRowsB) = A B^T of two K-major swizzled tiles, A (64, D) and B
// (kRowsB, D), the first product overwriting d (the backward's) ...
template <typename T, int D, int kRowsB, int NT>
__device__ __forceinline__ void issue_product_nt(float (&d)[NT][4], const unsigned char* a_tile,
                                                 const unsigned char* b_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    wgmma_ss<T, NT>(d, k_major_descriptor<64>(a_tile, kk), k_major_descriptor<kRowsB>(b_tile, kk), kk > 0);
  }
}

// ... the same with A (64 x 16 KD) as register fragments (wgmma's "RS" form):
// the forward's S = Q K^T, Q's fragments against the (kRowsB, 16 KD) K tile ...
template <typename T, int kRowsB, int NT, int KD>
__device__ __forceinline__ void issue_product_nt_rs(float (&d)[NT][4], const uint32_t (&a)[KD][4],
                                                    const unsigned char* b_tile) {
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) wgmma<T, NT, false>(d, a[kk], k_major_descriptor<kRowsB>(b_tile, kk), kk > 0);
}

// ... and acc (64 x D) += A B, A (64 x 16 KN) as register fragments, B the
// (kRowsB = 16 KN, D) swizzled tile read MN-major (also the forward's O += P V).
template <typename T, int kRowsB, int DT, int KN>
__device__ __forceinline__ void issue_product_nn(float (&acc)[DT][4], const uint32_t (&a)[KN][4],
                                                 const unsigned char* b_tile) {
  static_assert(16 * KN == kRowsB, "A's columns are B's rows");
#pragma unroll
  for (int kk = 0; kk < KN; ++kk) wgmma<T, DT, true>(acc, a[kk], mn_major_descriptor<kRowsB>(b_tile, kk), true);
}

}  // namespace
}  // namespace kiln::kernels::attention_tc
