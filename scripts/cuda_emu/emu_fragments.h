// The PTX ISA's register layouts of ldmatrix.sync.aligned.m8n8.x4[.trans]
// (16-bit elements) and mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}
// (float accumulators), as functions of all 32 lanes' operands. Both
// emulators call these between two warp barriers, after each lane has put
// its operands in its warp's exchange arrays: prelude.h's (one thread per
// CUDA thread, for attention_tc*.cu) and emu_cuda.h's (for attention.cu's
// reference kernels). One reading of the tables, shared: a mistake in it would
// show in both, and is not what these emulations can check (see run.sh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace emu_fragments {

inline uint16_t b16_at(const void* p, int element) {
  uint16_t v;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + 2 * element, 2);
  return v;
}

template <typename T>
float to_float(uint16_t bits) {
  T x;
  std::memcpy(&x, &bits, 2);
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

// ldmatrix x4: lanes 8i..8i+7 give the row addresses of matrix i (rows[]);
// r[i] of lane l = (row l/4, cols 2(l%4), +1), or with .trans (rows 2(l%4), +1; col l/4).
inline void ldmatrix(uint32_t (&r)[4], const void* const (&rows)[32], int lane, bool trans) {
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      lo = b16_at(rows[8 * i + g], 2 * t);
      hi = b16_at(rows[8 * i + g], 2 * t + 1);
    } else {
      lo = b16_at(rows[8 * i + 2 * t], g);
      hi = b16_at(rows[8 * i + 2 * t + 1], g);
    }
    r[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
}

// d += A B for `lane`'s four accumulators, A (16x16, row) and B (16x8, col)
// gathered from every lane's a[4] and b[2] registers per the PTX tables.
template <typename T>
void mma(float (&d)[4], const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int lane) {
  float A[16][16], B[16][8];
  for (int x = 0; x < 32; ++x) {
    const int g = x / 4, t = x % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int i = 0; i < 4; ++i) {
      A[rows[i]][cols[i]] = to_float<T>(a[x][i] & 0xffff);
      A[rows[i]][cols[i] + 1] = to_float<T>(a[x][i] >> 16);
    }
    B[2 * t][g] = to_float<T>(b[x][0] & 0xffff);
    B[2 * t + 1][g] = to_float<T>(b[x][0] >> 16);
    B[2 * t + 8][g] = to_float<T>(b[x][1] & 0xffff);
    B[2 * t + 9][g] = to_float<T>(b[x][1] >> 16);
  }
  const int g = lane / 4, t = lane % 4;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int e = 0; e < 4; ++e) {
    float sum = d[e];
    for (int k = 0; k < 16; ++k) sum += A[rows[e]][k] * B[k][cols[e]];
    d[e] = sum;
  }
}

}  // namespace emu_fragments
