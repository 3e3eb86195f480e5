// CPU 3x3 convolution by Winograd's minimal filtering F(2x2, 3x3) or
// F(3x3, 3x3) (Lavin & Gray 2015, "Fast Algorithms for Convolutional Neural
// Networks"). Written for F(2x2) below; F(3x3) is the same with 3x3 output
// tiles from 5x5 windows at stride 3 and 25 positions (3.24x fewer
// multiply-adds than direct), see kBT3 and the m = 3 transforms. The drivers
// take the tile size m as a template parameter: forward and backward (used
// for F(2x2)) split the batch into blocks and chunks as below;
// forward_by_position and backward_by_position (used for F(3x3), on small
// planes) split the GEMMs by position instead.
//
// Each 2x2 output tile comes from the 4x4 input window d at (2*ty - pad_h,
// 2*tx - pad_w): Y = A^T [(G g G^T) . (B^T d B)] A. Summed over the input
// channels, the elementwise product becomes, for each of the 16 positions xi
// of the 4x4 tile, one GEMM M[xi] (O, tiles) = V[xi] (O, C) * U[xi] (C, tiles)
// with V = G g G^T and U = B^T d B: 16 multiply-adds per tile and channel pair
// instead of 36 for four outputs, 2.25x fewer (fewer on planes of odd size,
// whose last tile row and column are half used).
//
// The backward is the exact adjoint of that linear map:
//   dM = A dY A^T per tile; dU[xi] = V[xi]^T dM[xi]; dx = B dU B^T summed
//   over the overlapping windows (only inside the real plane);
//   dV[xi] = sum over tiles dM[xi] U[xi]^T; dweight = G^T dV G.
//
// Invariants, as in conv.cpp: contiguous NCHW; outputs written (=). The tiles
// of whole samples go side by side into one block (16 matrices (C, tiles) U,
// (O, tiles) M); blocks are spread over the threads and each runs Eigen
// single-threaded. The parallel loops have no `if` clause: inside any team
// Eigen stays single-threaded, so a GEMM's blocking (and rounding) never
// depends on the thread count. Scratch is thread-local and only grows, so
// steady training allocates nothing here. The weight gradient is summed per
// fixed chunk of samples (dV in the chunk's thread's scratch, transformed to a
// (9, O, C) partial), and the partials are added in chunk order: results do
// not depend on the thread count.
//
// The tile transforms live in conv_winograd_transforms.h.
#include "kernels/cpu/conv_winograd.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <vector>

#include "kernels/cpu/conv_winograd_transforms.h"
#include "kernels/cpu/eigen_scratch.h"
#include "kernels/error.h"

namespace kiln::kernels {

namespace {

using namespace winograd;  // NOLINT: the transforms are this file's internals

// The slots of this file's scratch buffers (eigen_scratch.h).
enum BufferSlot { kInputTiles, kProductTiles, kPlane, kWeights, kWeightTiles, kPartials, kSlots };

// Samples per block and per weight-gradient chunk, fixed by the shape alone.
// Blocks: whole samples, equal parts of a chunk, each at most kMaxBlockTiles
// tiles wide. Measured on one core, batch 128, cpu ms forward/backward for
// blocks of at most 49/64/100/128/256 tiles: 128->256 14x14 86.6/86.5/84.4/
// 84.3/94.3 and 177/175/167/170/185; 256->512 7x7 129/128/125/123/127 and
// 268/258/243/233/251 (U and M of a wider block spill out of L2; a narrower
// one packs the weights for fewer columns). A 28x28 sample (196 tiles) is one block.
// Chunks: a power of two (even work for 2^k threads), at most kMaxWeightChunks,
// the batch, and one per kMinChunkTiles tiles. Each chunk costs a transform of
// its (16, O, C) weight-gradient tiles plus its share of the final sum: the
// 256->512 7x7 backward measured 256/246/238/232 ms with 16/8/4/2 chunks. 8
// keeps up to 8 threads busy for ~4% over 2.
constexpr int64_t kMaxBlockTiles = 128;
constexpr int64_t kMaxWeightChunks = 8;
constexpr int64_t kMinChunkTiles = 128;

struct Blocking {
  int64_t chunks, per_chunk, per_block;
};
Blocking blocking(const Conv2dParams& p, const Tiling& tiling) {
  const int64_t limit =
      std::min({p.batch, kMaxWeightChunks, std::max<int64_t>(1, p.batch * tiling.tiles / kMinChunkTiles)});
  int64_t chunks = 1;
  while (chunks * 2 <= limit) chunks *= 2;
  const int64_t per_chunk = ceil_div(p.batch, chunks);
  const int64_t cap = std::max<int64_t>(1, kMaxBlockTiles / tiling.tiles);
  return {ceil_div(p.batch, per_chunk), per_chunk, ceil_div(per_chunk, ceil_div(per_chunk, cap))};
}

// U (xi, C, count * tiles): the input planes of samples first..first+count
// transformed by the calling thread, each sample's tiles side by side.
template <int m, typename T>
void transform_block_input(const Conv2dParams& p, const Tiling& g, const T* x, int64_t first, int64_t count, T* U,
                           T* scratch) {
  const int64_t C = p.in_channels, HW = p.in_h * p.in_w, columns = count * g.tiles;
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t c = 0; c < C; ++c) {
      Transforms<m>::input_plane(g, x + ((first + s) * C + c) * HW, U + c * columns + s * g.tiles, C * columns,
                                 scratch);
    }
  }
}

template <int m, typename T>
void forward(const Conv2dParams& p, const T* x, const T* weight, const T* bias, T* y) {
  constexpr int64_t kPositions = positions(m);
  const Tiling g(p, m);
  const Blocking b = blocking(p, g);
  const int64_t C = p.in_channels, O = p.out_channels, P = p.out_h * p.out_w;
  const int64_t blocks_per_chunk = ceil_div(b.per_chunk, b.per_block);
  T* V = thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeights);  // (positions, O, C)
  Transforms<m>::weights(O, C, weight, V);
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < b.chunks * blocks_per_chunk; ++block) {
    const int64_t chunk = block / blocks_per_chunk, chunk_end = std::min(p.batch, (chunk + 1) * b.per_chunk);
    const int64_t first = chunk * b.per_chunk + (block % blocks_per_chunk) * b.per_block;
    const int64_t count = std::min(b.per_block, chunk_end - first);
    if (count <= 0) continue;
    const int64_t columns = count * g.tiles;
    T* U = thread_buffer<T>(static_cast<size_t>(kPositions * C * columns), kInputTiles);  // (xi, C, columns)
    T* M = thread_buffer<T>(static_cast<size_t>(kPositions * O * columns), kProductTiles);  // (xi, O, columns)
    T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
    transform_block_input<m>(p, g, x, first, count, U, scratch);
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      MapRM<T>(M + xi * O * columns, O, columns).noalias() =
          ConstMapRM<T>(V + xi * O * C, O, C) * ConstMapRM<T>(U + xi * C * columns, C, columns);
    }
    for (int64_t s = 0; s < count; ++s) {
      for (int64_t o = 0; o < O; ++o) {
        Transforms<m>::output_plane(g, M + o * columns + s * g.tiles, O * columns, bias != nullptr ? bias[o] : T(0),
                               y + ((first + s) * O + o) * P, scratch);
      }
    }
  }
}

template <int m, typename T>
void backward(const Conv2dParams& p, const T* x, const T* weight, const T* dy, T* dx, T* dweight) {
  if (dx == nullptr && dweight == nullptr) return;
  constexpr int64_t kPositions = positions(m);
  const Tiling g(p, m);
  const Blocking b = blocking(p, g);
  const int64_t C = p.in_channels, O = p.out_channels, HW = p.in_h * p.in_w, P = p.out_h * p.out_w;
  const int64_t weight_numel = O * C * 9;
  T* V = nullptr;  // (positions, O, C)
  if (dx != nullptr) {
    V = thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeights);
    Transforms<m>::weights(O, C, weight, V);
  }
  // (chunks, 9, O, C) weight gradients of each chunk, tap-major.
  T* partials = dweight != nullptr ? thread_buffer<T>(static_cast<size_t>(b.chunks * weight_numel), kPartials)
                                   : nullptr;
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < b.chunks; ++chunk) {
    const int64_t chunk_end = std::min(p.batch, (chunk + 1) * b.per_chunk);
    T* dV = dweight != nullptr ? thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeightTiles) : nullptr;
    for (int64_t first = chunk * b.per_chunk; first < chunk_end; first += b.per_block) {
      const int64_t count = std::min(b.per_block, chunk_end - first), columns = count * g.tiles;
      T* U = thread_buffer<T>(static_cast<size_t>(kPositions * C * columns), kInputTiles);    // (xi, C, columns)
      T* dM = thread_buffer<T>(static_cast<size_t>(kPositions * O * columns), kProductTiles);  // (xi, O, columns)
      T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
      for (int64_t s = 0; s < count; ++s) {
        for (int64_t o = 0; o < O; ++o) {
          Transforms<m>::output_gradient_plane(g, dy + ((first + s) * O + o) * P, dM + o * columns + s * g.tiles,
                                          O * columns, scratch);
        }
      }
      if (dV != nullptr) {
        transform_block_input<m>(p, g, x, first, count, U, scratch);
        const bool first_block = first == chunk * b.per_chunk;
        for (int64_t xi = 0; xi < kPositions; ++xi) {
          MapRM<T> dv(dV + xi * O * C, O, C);
          ConstMapRM<T> dm(dM + xi * O * columns, O, columns);
          ConstMapRM<T> u(U + xi * C * columns, C, columns);
          if (first_block) {
            dv.noalias() = dm * u.transpose();
          } else {
            dv.noalias() += dm * u.transpose();
          }
        }
      }
      if (dx != nullptr) {
        T* dU = U;  // U is no longer needed
        for (int64_t xi = 0; xi < kPositions; ++xi) {
          MapRM<T>(dU + xi * C * columns, C, columns).noalias() =
              ConstMapRM<T>(V + xi * O * C, O, C).transpose() * ConstMapRM<T>(dM + xi * O * columns, O, columns);
        }
        for (int64_t s = 0; s < count; ++s) {
          for (int64_t c = 0; c < C; ++c) {
            Transforms<m>::input_gradient_plane(g, dU + c * columns + s * g.tiles, C * columns,
                                           dx + ((first + s) * C + c) * HW, scratch);
          }
        }
      }
    }
    if (dV != nullptr) Transforms<m>::weight_gradient(O, C, dV, partials + chunk * weight_numel);
  }
  if (dweight == nullptr) return;
  // dweight (O, C, 3, 3) = the partials (9, O, C) summed in chunk order.
  const int64_t filters = O * C;
#pragma omp parallel for schedule(static)
  for (int64_t first = 0; first < filters; first += kFilterBlock) {
    const int64_t count = std::min(kFilterBlock, filters - first);
    T taps[9][kFilterBlock];
    for (int64_t k = 0; k < 9; ++k) {
      std::copy(partials + k * filters + first, partials + k * filters + first + count, taps[k]);
      for (int64_t chunk = 1; chunk < b.chunks; ++chunk) {
        const T* partial = partials + chunk * weight_numel + k * filters + first;
        for (int64_t i = 0; i < count; ++i) taps[k][i] += partial[i];
      }
    }
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t k = 0; k < 9; ++k) dweight[(first + i) * 9 + k] = taps[k][i];
    }
  }
}


// U (xi, C, batch * tiles): every input plane of the batch transformed, each
// sample's tiles side by side (the layout of forward_by_position's GEMMs).
template <int m, typename T>
void transform_batch_input(const Conv2dParams& p, const Tiling& g, const T* x, T* U) {
  const int64_t C = p.in_channels, HW = p.in_h * p.in_w, columns = p.batch * g.tiles;
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < p.batch * C; ++plane) {
    T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
    Transforms<m>::input_plane(g, x + plane * HW, U + (plane % C) * columns + (plane / C) * g.tiles, C * columns,
                               scratch);
  }
}

// The same computation with the whole batch as one block and the GEMMs, one
// per position xi, spread over the threads instead of the samples: for
// F(3x3), which runs only on small planes (a tile or a few per sample), so
// U and M, (25, C or O, batch * tiles), are ~2.8x the input and output. A
// per-sample split would leave the threads few blocks, or cost the weight
// gradient a (25, O, C) transform and sum per chunk (the 512->512 3x3
// backward measured 83/91/113/156 ms on one core with 1/2/4/8 chunks). Each
// GEMM, transform and sum is done whole by one thread: results do not depend
// on the thread count, and the weight gradient needs no partials.
template <int m, typename T>
void forward_by_position(const Conv2dParams& p, const T* x, const T* weight, const T* bias, T* y) {
  constexpr int64_t kPositions = positions(m);
  const Tiling g(p, m);
  const int64_t C = p.in_channels, O = p.out_channels, P = p.out_h * p.out_w;
  const int64_t columns = p.batch * g.tiles;
  T* V = thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeights);             // (xi, O, C)
  T* U = thread_buffer<T>(static_cast<size_t>(kPositions * C * columns), kInputTiles);    // (xi, C, columns)
  T* M = thread_buffer<T>(static_cast<size_t>(kPositions * O * columns), kProductTiles);  // (xi, O, columns)
  Transforms<m>::weights(O, C, weight, V);
  transform_batch_input<m>(p, g, x, U);
#pragma omp parallel for schedule(static)
  for (int64_t xi = 0; xi < kPositions; ++xi) {
    MapRM<T>(M + xi * O * columns, O, columns).noalias() =
        ConstMapRM<T>(V + xi * O * C, O, C) * ConstMapRM<T>(U + xi * C * columns, C, columns);
  }
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < p.batch * O; ++plane) {
    T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
    const int64_t o = plane % O;
    Transforms<m>::output_plane(g, M + o * columns + (plane / O) * g.tiles, O * columns,
                                bias != nullptr ? bias[o] : T(0), y + plane * P, scratch);
  }
}

template <int m, typename T>
void backward_by_position(const Conv2dParams& p, const T* x, const T* weight, const T* dy, T* dx, T* dweight) {
  if (dx == nullptr && dweight == nullptr) return;
  constexpr int64_t kPositions = positions(m);
  const Tiling g(p, m);
  const int64_t C = p.in_channels, O = p.out_channels, HW = p.in_h * p.in_w, P = p.out_h * p.out_w;
  const int64_t columns = p.batch * g.tiles;
  T* U = thread_buffer<T>(static_cast<size_t>(kPositions * C * columns), kInputTiles);     // (xi, C, columns)
  T* dM = thread_buffer<T>(static_cast<size_t>(kPositions * O * columns), kProductTiles);  // (xi, O, columns)
#pragma omp parallel for schedule(static)
  for (int64_t plane = 0; plane < p.batch * O; ++plane) {
    T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
    Transforms<m>::output_gradient_plane(g, dy + plane * P, dM + (plane % O) * columns + (plane / O) * g.tiles,
                                         O * columns, scratch);
  }
  if (dweight != nullptr) {
    T* dV = thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeightTiles);  // (xi, O, C)
    T* taps = thread_buffer<T>(static_cast<size_t>(O * C * 9), kPartials);         // (9, O, C)
    transform_batch_input<m>(p, g, x, U);
#pragma omp parallel for schedule(static)
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      ConstMapRM<T> dm(dM + xi * O * columns, O, columns), u(U + xi * C * columns, C, columns);
      MapRM<T>(dV + xi * O * C, O, C).noalias() = dm * u.transpose();
    }
    Transforms<m>::weight_gradient(O, C, dV, taps);
    const int64_t filters = O * C;
#pragma omp parallel for schedule(static)
    for (int64_t f = 0; f < filters; ++f) {
      for (int64_t k = 0; k < 9; ++k) dweight[f * 9 + k] = taps[k * filters + f];
    }
  }
  if (dx != nullptr) {
    T* V = thread_buffer<T>(static_cast<size_t>(kPositions * O * C), kWeights);  // (xi, O, C)
    Transforms<m>::weights(O, C, weight, V);
    T* dU = U;  // U is no longer needed
#pragma omp parallel for schedule(static)
    for (int64_t xi = 0; xi < kPositions; ++xi) {
      MapRM<T>(dU + xi * C * columns, C, columns).noalias() =
          ConstMapRM<T>(V + xi * O * C, O, C).transpose() * ConstMapRM<T>(dM + xi * O * columns, O, columns);
    }
#pragma omp parallel for schedule(static)
    for (int64_t plane = 0; plane < p.batch * C; ++plane) {
      T* scratch = thread_buffer<T>(static_cast<size_t>(g.plane_scratch()), kPlane);
      Transforms<m>::input_gradient_plane(g, dU + (plane % C) * columns + (plane / C) * g.tiles, C * columns,
                                          dx + plane * HW, scratch);
    }
  }
}
}  // namespace

bool conv2d_winograd_supports(const Conv2dParams& p) {
  return p.kernel_h == 3 && p.kernel_w == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.groups == 1 && p.out_h > 0 && p.out_w > 0;
}

// Where the path pays, measured on one core (x86-64-v3 build on an AMD EPYC
// with 1 MB of L2 per core), batch 128 unless said, cpu ms forward/backward,
// im2col + GEMM -> Winograd F(2x2) (-> F(3x3) where measured):
//   ResNet-9: 64->128 28x28 151/309 -> 87/168 -> 212/324; 128->128 14x14
//     81/165 -> 45/87 -> 88/161; 128->256 14x14 151/315 -> 83/170 -> 180/287;
//     256->512 7x7 166/390 -> 123/240 -> 200/346; 512->512 3x3 66/141 ->
//     73/164 (9 outputs in 16 tile positions: only 1.27x fewer multiply-adds)
//     -> 45/82 (one F(3x3) tile: 3.24x fewer; on 2 threads, wall ms, im2col
//     32-41/73 -> 30/52). FashionCNN's 32->64 14x14 11.6/23.6 -> 8.2/15.1.
//   F(3x3) on other planes that are whole tiles (on a machine shared with
//     other jobs): 256->256 6x6 60/128 -> 32/73 -> 51/99; 512->512 6x6
//     239/516 -> 140/295 -> 155/293; 256->256 9x9 129/326 -> 93/182 -> 108/197.
//   Input channels (the GEMMs' depth): 16->8 28x28 6.0/12.0 -> 4.2/8.3;
//     12->32 28x28 9.6/20.2 -> 8.5/16.6; 8->32 28x28 6.3/13.2 -> 6.6/11.7;
//     8->64 14x14 3.1/6.4 -> 3.9/6.5; 3->64 28x28 4.9/11.6 -> 9.4/18.7.
//   Plane: 128->128 5x5 12.6/26.9 -> 9.3/19.9 (1.56x fewer multiply-adds);
//     256->256 2x2 9.0/18.2 -> 7.5/20.1; 64->64 1x1 0.5/0.8 -> 1.0/2.1.
//   Tiles in the batch (the weight transforms cost O*C*16 per call and per
//     chunk, whatever the batch): 512->512 4x4 with batch 4 (16 tiles)
//     4.3/8.4 -> 6.5/13.3, batch 8 (32) 8.0/16.1 -> 8.3/16.5, batch 16 (64)
//     14.8/32.0 -> 13.0/24.5; 256->512 7x7 batch 4 (64) 5.3/10.7 -> 5.3/10.0.
// Hence: at least 16 input channels, at least 16 outputs per plane (9 with
// F(3x3)) of which the tiles use enough to save 1.5x the multiply-adds (2/3
// of a F(2x2) tile), and 64 tiles.
namespace {
std::atomic<WinogradPolicy> winograd_policy{WinogradPolicy::kWhenFaster};
std::atomic<WinogradTile> winograd_tile{WinogradTile::kWhenFaster};

// F(3x3) where its tiles need under half the positions of F(2x2)'s: its
// transforms go one tile at a time (no vectorization over a plane's tiles),
// which costs more than its fewer positions save unless F(2x2) wastes most of
// its tiles (figures above conv2d_winograd_pays).
int faster_tile_size(const Conv2dParams& p) {
  return 2 * positions(3) * Tiling(p, 3).tiles < positions(2) * Tiling(p, 2).tiles ? 3 : 2;
}
}  // namespace

void conv2d_winograd_set_tile(WinogradTile tile) { winograd_tile.store(tile); }

int conv2d_winograd_tile_size(const Conv2dParams& p) {
  switch (winograd_tile.load()) {
    case WinogradTile::kWhenFaster: return faster_tile_size(p);
    case WinogradTile::k2x2: return 2;
    case WinogradTile::k3x3: return 3;
  }
  return 2;
}

bool conv2d_winograd_pays(const Conv2dParams& p) {
  if (!conv2d_winograd_supports(p)) return false;
  const int m = faster_tile_size(p);
  const Tiling tiling(p, m);
  const int64_t outputs = p.out_h * p.out_w;
  // 9 multiply-adds per output direct, positions(m) per tile: at least 1.5x fewer.
  return p.in_channels >= 16 && (outputs >= 16 || m == 3) && 6 * outputs >= positions(m) * tiling.tiles &&
         p.batch * tiling.tiles >= 64;
}

void conv2d_winograd_set_policy(WinogradPolicy policy) { winograd_policy.store(policy); }

bool conv2d_winograd_selected(const Conv2dParams& p) {
  switch (winograd_policy.load()) {
    case WinogradPolicy::kWhenFaster: return conv2d_winograd_pays(p);
    case WinogradPolicy::kAlways: return conv2d_winograd_supports(p);
    case WinogradPolicy::kNever: return false;
  }
  return false;
}

namespace {
template <typename T>
void forward_tiled(const Conv2dParams& p, const T* x, const T* weight, const T* bias, T* y) {
  if (conv2d_winograd_tile_size(p) == 3) return forward_by_position<3>(p, x, weight, bias, y);
  forward<2>(p, x, weight, bias, y);
}
template <typename T>
void backward_tiled(const Conv2dParams& p, const T* x, const T* weight, const T* dy, T* dx, T* dweight) {
  if (conv2d_winograd_tile_size(p) == 3) return backward_by_position<3>(p, x, weight, dy, dx, dweight);
  backward<2>(p, x, weight, dy, dx, dweight);
}
}  // namespace

void conv2d_winograd_forward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight,
                                 const void* bias, void* y) {
  KILN_CHECK(conv2d_winograd_supports(p), "conv2d winograd (cpu kernel): needs a 3x3 kernel, stride 1, dilation 1, "
             "groups 1, got kernel ", p.kernel_h, "x", p.kernel_w, ", stride ", p.stride_h, "x", p.stride_w,
             ", dilation ", p.dilation_h, "x", p.dilation_w, ", groups ", p.groups);
  dispatch_f32_f64(dtype, "conv2d winograd (cpu kernel)", [&]<typename T>() {
    forward_tiled(p, static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
                  static_cast<T*>(y));
  });
}

void conv2d_winograd_backward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight,
                                  const void* dy, void* dx, void* dweight) {
  KILN_CHECK(conv2d_winograd_supports(p), "conv2d winograd backward (cpu kernel): needs a 3x3 kernel, stride 1, "
             "dilation 1, groups 1, got kernel ", p.kernel_h, "x", p.kernel_w, ", stride ", p.stride_h, "x",
             p.stride_w, ", dilation ", p.dilation_h, "x", p.dilation_w, ", groups ", p.groups);
  dispatch_f32_f64(dtype, "conv2d winograd backward (cpu kernel)", [&]<typename T>() {
    backward_tiled(p, static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(dy),
                   static_cast<T*>(dx), static_cast<T*>(dweight));
  });
}

}  // namespace kiln::kernels
