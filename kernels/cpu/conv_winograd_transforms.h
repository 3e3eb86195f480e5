// The Winograd tile transforms of kernels/cpu/conv_winograd.cpp: the
// tiling of a plane, F(2x2, 3x3)'s hand-written plane and weight transforms,
// and F(3x3, 3x3)'s from its constant matrices. Internal to that file (split
// out to keep both files small); everything is in kiln::kernels::winograd.
//
// The transforms run on whole planes: B^T d B is split into a pass along each
// padded input row (shared by the two tile rows that overlap on it) and a pass
// down the columns that is one flat loop over the plane's tiles (tile t =
// ty * tiles_w + tx, so the row below is t + tiles_w); the other three
// transforms are split the same way. The flat loops vectorize on 7x7 planes
// (16 tiles) where per-row loops of 4 would not. Each flat loop writes one
// array: GCC 12 left the loops that wrote four unvectorized (it gives up on
// the aliasing checks).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/conv.h"

namespace kiln::kernels::winograd {

// Positions of the transformed (m + 2) x (m + 2) tile.
constexpr int64_t positions(int m) { return (m + 2) * (m + 2); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The m x m output tiles of one plane and the zero-bordered input plane that
// holds every tile's (m + 2) x (m + 2) window: padded row r is input row r - pad_h.
struct Tiling {
  int64_t m, H, W, OH, OW, pad_h, pad_w;
  int64_t tiles_h, tiles_w, tiles;  // tiles = tiles_h * tiles_w
  int64_t padded_h, padded_w;       // m * tiles + 2
  Tiling(const Conv2dParams& p, int64_t tile)
      : m(tile), H(p.in_h), W(p.in_w), OH(p.out_h), OW(p.out_w), pad_h(p.pad_h), pad_w(p.pad_w),
        tiles_h(ceil_div(p.out_h, tile)), tiles_w(ceil_div(p.out_w, tile)), tiles(tiles_h * tiles_w),
        padded_h(tile * tiles_h + 2), padded_w(tile * tiles_w + 2) {}
  // Scratch of one plane transform (the largest of the four; m = 3 needs only the padded plane).
  int64_t plane_scratch() const { return padded_h * padded_w + 8 * (tiles_h + 1) * tiles_w + 4 * tiles_w; }
};

// Filters per step of the weight transforms: their intermediate rows stay in
// L1, and the loops over them vectorize.
constexpr int64_t kFilterBlock = 128;

// V (16, O, C) = G g G^T of every 3x3 filter g of weight (O, C, 3, 3), with
// G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1].
template <typename T>
void transform_weights(int64_t O, int64_t C, const T* weight, T* V) {
  const int64_t filters = O * C;
  T taps[9][kFilterBlock], rows[4][3][kFilterBlock];  // g (3, 3) and G g (4, 3), filter-minor
  for (int64_t first = 0; first < filters; first += kFilterBlock) {
    const int64_t count = std::min(kFilterBlock, filters - first);
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t k = 0; k < 9; ++k) taps[k][i] = weight[(first + i) * 9 + k];
    }
    for (int64_t j = 0; j < 3; ++j) {
      for (int64_t i = 0; i < count; ++i) {
        const T g0 = taps[j][i], g1 = taps[3 + j][i], g2 = taps[6 + j][i];
        rows[0][j][i] = g0;
        rows[1][j][i] = T(0.5) * (g0 + g1 + g2);
        rows[2][j][i] = T(0.5) * (g0 - g1 + g2);
        rows[3][j][i] = g2;
      }
    }
    for (int64_t r = 0; r < 4; ++r) {  // (G g) G^T
      const T* r0 = rows[r][0];
      const T* r1 = rows[r][1];
      const T* r2 = rows[r][2];
      T* v = V + 4 * r * filters + first;
      for (int64_t i = 0; i < count; ++i) v[i] = r0[i];
      for (int64_t i = 0; i < count; ++i) v[filters + i] = T(0.5) * (r0[i] + r1[i] + r2[i]);
      for (int64_t i = 0; i < count; ++i) v[2 * filters + i] = T(0.5) * (r0[i] - r1[i] + r2[i]);
      for (int64_t i = 0; i < count; ++i) v[3 * filters + i] = r2[i];
    }
  }
}

// dw (9, O, C) = G^T dv G for the tiles dV (16, O, C): the adjoint of
// transform_weights, tap-major so the loops vectorize (backward interleaves the
// taps into (O, C, 3, 3) when it sums the chunks).
template <typename T>
void transform_weight_gradient(int64_t O, int64_t C, const T* dV, T* dw) {
  const int64_t filters = O * C;
  T rows[3][4][kFilterBlock];  // G^T dv (3, 4), filter-minor
  for (int64_t first = 0; first < filters; first += kFilterBlock) {
    const int64_t count = std::min(kFilterBlock, filters - first);
    for (int64_t j = 0; j < 4; ++j) {
      const T* d0 = dV + j * filters + first;
      const T* d1 = dV + (4 + j) * filters + first;
      const T* d2 = dV + (8 + j) * filters + first;
      const T* d3 = dV + (12 + j) * filters + first;
      for (int64_t i = 0; i < count; ++i) rows[0][j][i] = d0[i] + T(0.5) * (d1[i] + d2[i]);
      for (int64_t i = 0; i < count; ++i) rows[1][j][i] = T(0.5) * (d1[i] - d2[i]);
      for (int64_t i = 0; i < count; ++i) rows[2][j][i] = T(0.5) * (d1[i] + d2[i]) + d3[i];
    }
    for (int64_t r = 0; r < 3; ++r) {  // (G^T dv) G
      const T* r0 = rows[r][0];
      const T* r1 = rows[r][1];
      const T* r2 = rows[r][2];
      const T* r3 = rows[r][3];
      T* w = dw + 3 * r * filters + first;
      for (int64_t i = 0; i < count; ++i) w[i] = r0[i] + T(0.5) * (r1[i] + r2[i]);
      for (int64_t i = 0; i < count; ++i) w[filters + i] = T(0.5) * (r1[i] - r2[i]);
      for (int64_t i = 0; i < count; ++i) w[2 * filters + i] = T(0.5) * (r1[i] + r2[i]) + r3[i];
    }
  }
}

// u[xi * stride + t] = (B^T d B)[xi] for every tile t of one input plane (H, W),
// with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1].
template <typename T>
void transform_input_plane(const Tiling& g, const T* plane, T* u, int64_t stride, T* scratch) {
  const int64_t tw = g.tiles_w, Wp = g.padded_w, rows = g.tiles_h + 1;
  T* padded = scratch;                   // (Hp, Wp)
  T* across = padded + g.padded_h * Wp;  // (2 parities, 4, tiles_h + 1, tiles_w): d B of each padded row
  std::fill(padded, padded + g.padded_h * Wp, T(0));
  for (int64_t h = 0; h < g.H; ++h) {
    std::copy(plane + h * g.W, plane + (h + 1) * g.W, padded + (h + g.pad_h) * Wp + g.pad_w);
  }
  for (int64_t r = 0; r < g.padded_h; ++r) {
    const T* d = padded + r * Wp;
    T* out = across + (r % 2) * 4 * rows * tw + (r / 2) * tw;
    for (int64_t tx = 0; tx < tw; ++tx) {
      const T d0 = d[2 * tx], d1 = d[2 * tx + 1], d2 = d[2 * tx + 2], d3 = d[2 * tx + 3];
      out[tx] = d0 - d2;
      out[rows * tw + tx] = d1 + d2;
      out[2 * rows * tw + tx] = d2 - d1;
      out[3 * rows * tw + tx] = d1 - d3;
    }
  }
  // Window rows 0..3 of tile t are padded rows 2ty..2ty+3: even[t], odd[t], even[t + tw], odd[t + tw].
  for (int64_t l = 0; l < 4; ++l) {
    const T* even = across + l * rows * tw;
    const T* odd = across + (4 + l) * rows * tw;
    T* u0 = u + l * stride;
    T* u1 = u + (4 + l) * stride;
    T* u2 = u + (8 + l) * stride;
    T* u3 = u + (12 + l) * stride;
    const int64_t n = g.tiles;
    for (int64_t t = 0; t < n; ++t) u0[t] = even[t] - even[t + tw];
    for (int64_t t = 0; t < n; ++t) u1[t] = odd[t] + even[t + tw];
    for (int64_t t = 0; t < n; ++t) u2[t] = even[t + tw] - odd[t];
    for (int64_t t = 0; t < n; ++t) u3[t] = odd[t] - odd[t + tw];
  }
}

// y (OH, OW) = A^T m A (+ bias) of every tile's m[xi * stride + t], clipped at
// the plane's edge, with A^T = [1 1 1 0; 0 1 -1 -1].
template <typename T>
void transform_output_plane(const Tiling& g, const T* m, int64_t stride, T bias, T* y, T* scratch) {
  const int64_t tw = g.tiles_w, n = g.tiles;
  T* down = scratch;  // (2 output rows, 4, tiles): A^T m
  for (int64_t l = 0; l < 4; ++l) {
    const T* m0 = m + l * stride;
    const T* m1 = m + (4 + l) * stride;
    const T* m2 = m + (8 + l) * stride;
    const T* m3 = m + (12 + l) * stride;
    T* s0 = down + l * n;
    T* s1 = down + (4 + l) * n;
    for (int64_t t = 0; t < n; ++t) s0[t] = m0[t] + m1[t] + m2[t];
    for (int64_t t = 0; t < n; ++t) s1[t] = m1[t] - m2[t] - m3[t];
  }
  const int64_t pairs = g.OW / 2;
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const T* s = down + (oh % 2) * 4 * n + (oh / 2) * tw;
    T* row = y + oh * g.OW;
    for (int64_t tx = 0; tx < pairs; ++tx) {
      row[2 * tx] = s[tx] + s[n + tx] + s[2 * n + tx] + bias;
      row[2 * tx + 1] = s[n + tx] - s[2 * n + tx] - s[3 * n + tx] + bias;
    }
    if (g.OW % 2 != 0) row[2 * pairs] = s[pairs] + s[n + pairs] + s[2 * n + pairs] + bias;
  }
}

// dm[xi * stride + t] = (A dY A^T)[xi] for every tile of one output-gradient
// plane dy (OH, OW), zero beyond the plane's edge: the adjoint of transform_output_plane.
template <typename T>
void transform_output_gradient_plane(const Tiling& g, const T* dy, T* dm, int64_t stride, T* scratch) {
  const int64_t tw = g.tiles_w, n = g.tiles;
  T* across = scratch;  // (2 rows of the tile, 4, tiles): dY A^T
  const int64_t pairs = g.OW / 2;
  for (int64_t r = 0; r < 2 * g.tiles_h; ++r) {
    T* out = across + (r % 2) * 4 * n + (r / 2) * tw;
    if (r >= g.OH) {
      for (int64_t l = 0; l < 4; ++l) std::fill(out + l * n, out + l * n + tw, T(0));
      continue;
    }
    const T* row = dy + r * g.OW;
    for (int64_t tx = 0; tx < pairs; ++tx) {
      const T y0 = row[2 * tx], y1 = row[2 * tx + 1];
      out[tx] = y0;
      out[n + tx] = y0 + y1;
      out[2 * n + tx] = y0 - y1;
      out[3 * n + tx] = -y1;
    }
    if (g.OW % 2 != 0) {
      const T y0 = row[2 * pairs];
      out[pairs] = y0;
      out[n + pairs] = y0;
      out[2 * n + pairs] = y0;
      out[3 * n + pairs] = T(0);
    }
  }
  for (int64_t l = 0; l < 4; ++l) {
    const T* q0 = across + l * n;
    const T* q1 = across + (4 + l) * n;
    T* d0 = dm + l * stride;
    T* d1 = dm + (4 + l) * stride;
    T* d2 = dm + (8 + l) * stride;
    T* d3 = dm + (12 + l) * stride;
    std::copy(q0, q0 + n, d0);
    for (int64_t t = 0; t < n; ++t) d1[t] = q0[t] + q1[t];
    for (int64_t t = 0; t < n; ++t) d2[t] = q0[t] - q1[t];
    for (int64_t t = 0; t < n; ++t) d3[t] = -q1[t];
  }
}

// dx (H, W) = sum over tiles of B du B^T placed at each tile's window, for
// du[xi * stride + t]: the adjoint of transform_input_plane. Each padded row
// and column gathers the two windows that overlap on it, so nothing is summed
// into memory twice.
template <typename T>
void transform_input_gradient_plane(const Tiling& g, const T* du, int64_t stride, T* dx, T* scratch) {
  const int64_t tw = g.tiles_w, n = g.tiles, rows = g.tiles_h + 1;
  T* down = scratch;  // (2 parities, 4, tiles_h + 1, tiles_w): B du, gathered per padded row
  for (int64_t l = 0; l < 4; ++l) {
    const T* u0 = du + l * stride;
    const T* u1 = du + (4 + l) * stride;
    const T* u2 = du + (8 + l) * stride;
    const T* u3 = du + (12 + l) * stride;
    T* even = down + l * rows * tw;
    T* odd = down + (4 + l) * rows * tw;
    // Padded row 2ry is window row 0 of tile row ry and row 2 of ry - 1;
    // row 2ry + 1 is row 1 of ry and row 3 of ry - 1. B's rows: u0;
    // u1 - u2 + u3; -u0 + u1 + u2; -u3.
    for (int64_t t = 0; t < tw; ++t) {
      even[t] = u0[t];
      odd[t] = u1[t] - u2[t] + u3[t];
    }
    for (int64_t t = tw; t < n; ++t) even[t] = u0[t] + (u1[t - tw] + u2[t - tw] - u0[t - tw]);
    for (int64_t t = tw; t < n; ++t) odd[t] = (u1[t] - u2[t] + u3[t]) - u3[t - tw];
    for (int64_t t = n; t < n + tw; ++t) {
      even[t] = u1[t - tw] + u2[t - tw] - u0[t - tw];
      odd[t] = -u3[t - tw];
    }
  }
  T* row = down + 8 * rows * tw;  // (padded_w) one padded row of dx
  for (int64_t h = 0; h < g.H; ++h) {
    const int64_t r = h + g.pad_h;
    const T* v = down + (r % 2) * 4 * rows * tw + (r / 2) * tw;
    const T* v0 = v;
    const T* v1 = v + rows * tw;
    const T* v2 = v + 2 * rows * tw;
    const T* v3 = v + 3 * rows * tw;
    // Padded column 2cx is window column 0 of tile cx and 2 of cx - 1; 2cx + 1
    // is column 1 of cx and 3 of cx - 1.
    row[0] = v0[0];
    row[1] = v1[0] - v2[0] + v3[0];
    for (int64_t cx = 1; cx < tw; ++cx) {
      row[2 * cx] = v0[cx] + (v1[cx - 1] + v2[cx - 1] - v0[cx - 1]);
      row[2 * cx + 1] = (v1[cx] - v2[cx] + v3[cx]) - v3[cx - 1];
    }
    row[2 * tw] = v1[tw - 1] + v2[tw - 1] - v0[tw - 1];
    row[2 * tw + 1] = -v3[tw - 1];
    std::copy(row + g.pad_w, row + g.pad_w + g.W, dx + h * g.W);
  }
}

// The F(3x3, 3x3) matrices, from the interpolation points 0, 1, -1, 2 and
// infinity (Toom-Cook; B^T solved so that A^T [(G g) . (B^T d)] is the
// correlation of g with d). The other usual set, 0, 1, -1, 1/2, infinity,
// measured about the same rms error but a larger worst one (a standalone
// fp32 test of the 9 outputs of a tile summed over 1/16/512 channels, in
// units of u of the largest sum of |terms|: worst 31.8/12.2/8.2 u against
// 42.3/12.7/9.1 u, rms 2.4/1.2/1.0 u for both): its G has entries up to 8/3
// against 2/3 here.
// Row-major: A^T (3, 5), G (5, 3), B^T (5, 5).
constexpr double kAT3[15] = {1, 1, 1, 1, 0,  //
                             0, 1, -1, 2, 0,  //
                             0, 1, 1, 4, 1};
constexpr double kG3[15] = {0.5,       0,         0,           //
                            -0.5,      -0.5,      -0.5,        //
                            -1.0 / 6,  1.0 / 6,   -1.0 / 6,    //
                            1.0 / 6,   1.0 / 3,   2.0 / 3,     //
                            0,         0,         1};
constexpr double kBT3[25] = {2, -1, -2, 1,  0,  //
                             0, -2, -1, 1,  0,  //
                             0, 2,  -3, 1,  0,  //
                             0, -1, 0,  1,  0,  //
                             0, 2,  -1, -2, 1};

// out (R, K) = L (R, J) * in (J, K), for L a constant matrix of the above,
// stored with row stride L_stride and column stride L_step so that transposes
// need no copy. Zero coefficients are skipped: no work, and an infinite input
// makes no NaN from 0 * inf.
template <int R, int J, int K, typename T>
inline void apply(const double* L, int L_stride, int L_step, const T (&in)[J][K], T (&out)[R][K]) {
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      T sum = T(0);
      for (int j = 0; j < J; ++j) {
        const double c = L[r * L_stride + j * L_step];
        if (c != 0) sum += T(c) * in[j][k];
      }
      out[r][k] = sum;
    }
  }
}
// out (J, R) = in (J, K) * L^T, L (R, K) as in apply.
template <int R, int J, int K, typename T>
inline void apply_right(const double* L, int L_stride, int L_step, const T (&in)[J][K], T (&out)[J][R]) {
  for (int j = 0; j < J; ++j) {
    for (int r = 0; r < R; ++r) {
      T sum = T(0);
      for (int k = 0; k < K; ++k) {
        const double c = L[r * L_stride + k * L_step];
        if (c != 0) sum += in[j][k] * T(c);
      }
      out[j][r] = sum;
    }
  }
}

// apply and apply_right for kFilterBlock filters side by side (the last index),
// of which the first count are used.
template <int R, int J, int K, typename T>
void apply_filters(const double* L, int L_stride, int L_step, const T (&in)[J][K][kFilterBlock],
                   T (&out)[R][K][kFilterBlock], int64_t count) {
  for (int r = 0; r < R; ++r) {
    for (int k = 0; k < K; ++k) {
      T* o = out[r][k];
      std::fill(o, o + count, T(0));
      for (int j = 0; j < J; ++j) {
        const double c = L[r * L_stride + j * L_step];
        const T* v = in[j][k];
        if (c != 0) {
          for (int64_t i = 0; i < count; ++i) o[i] += T(c) * v[i];
        }
      }
    }
  }
}
template <int R, int J, int K, typename T>
void apply_filters_right(const double* L, int L_stride, int L_step, const T (&in)[J][K][kFilterBlock],
                         T (&out)[J][R][kFilterBlock], int64_t count) {
  for (int j = 0; j < J; ++j) {
    for (int r = 0; r < R; ++r) {
      T* o = out[j][r];
      std::fill(o, o + count, T(0));
      for (int k = 0; k < K; ++k) {
        const double c = L[r * L_stride + k * L_step];
        const T* v = in[j][k];
        if (c != 0) {
          for (int64_t i = 0; i < count; ++i) o[i] += v[i] * T(c);
        }
      }
    }
  }
}

// The four plane transforms and two weight transforms of tile size m.
template <int m>
struct Transforms;

template <>
struct Transforms<2> {
  template <typename T>
  static void weights(int64_t O, int64_t C, const T* weight, T* V) { transform_weights(O, C, weight, V); }
  template <typename T>
  static void weight_gradient(int64_t O, int64_t C, const T* dV, T* dw) { transform_weight_gradient(O, C, dV, dw); }
  template <typename T>
  static void input_plane(const Tiling& g, const T* plane, T* u, int64_t stride, T* scratch) {
    transform_input_plane(g, plane, u, stride, scratch);
  }
  template <typename T>
  static void output_plane(const Tiling& g, const T* m, int64_t stride, T bias, T* y, T* scratch) {
    transform_output_plane(g, m, stride, bias, y, scratch);
  }
  template <typename T>
  static void output_gradient_plane(const Tiling& g, const T* dy, T* dm, int64_t stride, T* scratch) {
    transform_output_gradient_plane(g, dy, dm, stride, scratch);
  }
  template <typename T>
  static void input_gradient_plane(const Tiling& g, const T* du, int64_t stride, T* dx, T* scratch) {
    transform_input_gradient_plane(g, du, stride, dx, scratch);
  }
};

// F(3x3, 3x3) one tile at a time through small fixed-size matrix products:
// its planes (3x3 in ResNet-9) have a tile or a few, where the GEMMs (25 * O *
// C per tile) outweigh the transforms (~25 * 10 per tile and channel) by far.
template <>
struct Transforms<3> {
  static constexpr const double* kA = kAT3;
  static constexpr const double* kG = kG3;
  static constexpr const double* kB = kBT3;

  // V[(5i + l) * filters + f] = (G g G^T)[i][l] for each filter f, kFilterBlock
  // filters at a time (filter-minor, so the loops vectorize).
  template <typename T>
  static void weights(int64_t O, int64_t C, const T* weight, T* V) {
    const int64_t filters = O * C;
    T taps[3][3][kFilterBlock], left[5][3][kFilterBlock], v[5][5][kFilterBlock];
    for (int64_t first = 0; first < filters; first += kFilterBlock) {
      const int64_t count = std::min(kFilterBlock, filters - first);
      for (int64_t i = 0; i < count; ++i) {
        for (int k = 0; k < 9; ++k) taps[k / 3][k % 3][i] = weight[(first + i) * 9 + k];
      }
      apply_filters<5, 3, 3>(kG, 3, 1, taps, left, count);
      apply_filters_right<5, 5, 3>(kG, 3, 1, left, v, count);
      for (int xi = 0; xi < 25; ++xi) std::copy(v[xi / 5][xi % 5], v[xi / 5][xi % 5] + count, V + xi * filters + first);
    }
  }
  // dw[(3j + k) * filters + f] = (G^T dv G)[j][k]: the adjoint of weights, tap-major.
  template <typename T>
  static void weight_gradient(int64_t O, int64_t C, const T* dV, T* dw) {
    const int64_t filters = O * C;
    T dv[5][5][kFilterBlock], left[3][5][kFilterBlock], taps[3][3][kFilterBlock];
    for (int64_t first = 0; first < filters; first += kFilterBlock) {
      const int64_t count = std::min(kFilterBlock, filters - first);
      for (int xi = 0; xi < 25; ++xi) {
        std::copy(dV + xi * filters + first, dV + xi * filters + first + count, dv[xi / 5][xi % 5]);
      }
      apply_filters<3, 5, 5>(kG, 1, 3, dv, left, count);
      apply_filters_right<3, 3, 5>(kG, 1, 3, left, taps, count);
      for (int k = 0; k < 9; ++k) std::copy(taps[k / 3][k % 3], taps[k / 3][k % 3] + count, dw + k * filters + first);
    }
  }
  // u[xi * stride + t] = (B^T d B)[xi] of each tile's 5x5 window d.
  template <typename T>
  static void input_plane(const Tiling& g, const T* plane, T* u, int64_t stride, T* scratch) {
    const int64_t Wp = g.padded_w;
    T* padded = scratch;
    std::fill(padded, padded + g.padded_h * Wp, T(0));
    for (int64_t h = 0; h < g.H; ++h) {
      std::copy(plane + h * g.W, plane + (h + 1) * g.W, padded + (h + g.pad_h) * Wp + g.pad_w);
    }
    for (int64_t t = 0; t < g.tiles; ++t) {
      const T* corner = padded + 3 * (t / g.tiles_w) * Wp + 3 * (t % g.tiles_w);
      T d[5][5], left[5][5], v[5][5];
      for (int r = 0; r < 5; ++r) {
        for (int c = 0; c < 5; ++c) d[r][c] = corner[r * Wp + c];
      }
      apply<5, 5, 5>(kB, 5, 1, d, left);
      apply_right<5, 5, 5>(kB, 5, 1, left, v);
      for (int xi = 0; xi < 25; ++xi) u[xi * stride + t] = v[xi / 5][xi % 5];
    }
  }
  // y (OH, OW) = A^T m A (+ bias) of each tile, clipped at the plane's edge.
  template <typename T>
  static void output_plane(const Tiling& g, const T* m, int64_t stride, T bias, T* y, T* /*scratch*/) {
    for (int64_t t = 0; t < g.tiles; ++t) {
      T mt[5][5], left[3][5], out[3][3];
      for (int xi = 0; xi < 25; ++xi) mt[xi / 5][xi % 5] = m[xi * stride + t];
      apply<3, 5, 5>(kA, 5, 1, mt, left);
      apply_right<3, 3, 5>(kA, 5, 1, left, out);
      const int64_t oh0 = 3 * (t / g.tiles_w), ow0 = 3 * (t % g.tiles_w);
      for (int r = 0; r < 3 && oh0 + r < g.OH; ++r) {
        for (int c = 0; c < 3 && ow0 + c < g.OW; ++c) y[(oh0 + r) * g.OW + ow0 + c] = out[r][c] + bias;
      }
    }
  }
  // dm[xi * stride + t] = (A dY A^T)[xi], dY zero beyond the plane's edge.
  template <typename T>
  static void output_gradient_plane(const Tiling& g, const T* dy, T* dm, int64_t stride, T* /*scratch*/) {
    for (int64_t t = 0; t < g.tiles; ++t) {
      const int64_t oh0 = 3 * (t / g.tiles_w), ow0 = 3 * (t % g.tiles_w);
      T d[3][3], left[5][3], out[5][5];
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 3; ++c) {
          d[r][c] = oh0 + r < g.OH && ow0 + c < g.OW ? dy[(oh0 + r) * g.OW + ow0 + c] : T(0);
        }
      }
      apply<5, 3, 3>(kA, 1, 5, d, left);
      apply_right<5, 5, 3>(kA, 1, 5, left, out);
      for (int xi = 0; xi < 25; ++xi) dm[xi * stride + t] = out[xi / 5][xi % 5];
    }
  }
  // dx (H, W) = sum over tiles of B du B^T at each tile's window, summed in
  // tile order into the padded plane: the adjoint of input_plane.
  template <typename T>
  static void input_gradient_plane(const Tiling& g, const T* du, int64_t stride, T* dx, T* scratch) {
    const int64_t Wp = g.padded_w;
    T* padded = scratch;
    std::fill(padded, padded + g.padded_h * Wp, T(0));
    for (int64_t t = 0; t < g.tiles; ++t) {
      T dv[5][5], left[5][5], window[5][5];
      for (int xi = 0; xi < 25; ++xi) dv[xi / 5][xi % 5] = du[xi * stride + t];
      apply<5, 5, 5>(kB, 1, 5, dv, left);
      apply_right<5, 5, 5>(kB, 1, 5, left, window);
      T* corner = padded + 3 * (t / g.tiles_w) * Wp + 3 * (t % g.tiles_w);
      for (int r = 0; r < 5; ++r) {
        for (int c = 0; c < 5; ++c) corner[r * Wp + c] += window[r][c];
      }
    }
    for (int64_t h = 0; h < g.H; ++h) {
      const T* row = padded + (h + g.pad_h) * Wp + g.pad_w;
      std::copy(row, row + g.W, dx + h * g.W);
    }
  }
};

}  // namespace kiln::kernels::winograd
