// CPU 2-D convolution: im2col + Eigen GEMM over blocks of samples.
//
// Invariants: every buffer is contiguous NCHW; outputs are written (=), never
// accumulated into. im2col reads a zero-bordered copy of the input planes and
// col2im sums into one, so no row segment is clipped (3x faster than clipping
// each segment). A block's columns (K = C/groups*kh*kw rows, P = OH*OW
// columns per sample, the block's samples side by side, row-major) live in a
// thread-local buffer that grows once and is reused, so steady training
// allocates nothing here. A block is one sample unless the planes are small
// (samples_per_gemm). Each task runs Eigen
// single-threaded (Eigen does not nest inside an OpenMP region); the batch is
// spread over the threads. The weight gradient is summed per fixed chunk of
// samples and the chunks are added in order: the result does not depend on
// the thread count.
//
// FLOP floor: 2 * N * O * OH*OW * (C/groups) * kh*kw per product (forward,
// input gradient, weight gradient each). Eigen's GEMM kernel runs near the
// core's AVX2 peak (~100 GFLOP/s) on a small CNN's per-sample shapes (M=64,
// N=196, K=288); with im2col/col2im the layer reaches ~77% of it. For C=1
// (FashionCNN's first layer, K=9) the forward is bound by writing its output,
// and a register-blocked small-K weight-gradient loop measured no faster than
// Eigen, so there is one path.
//
// 3x3 stride-1 ungrouped layers with 16+ input channels and planes of 4x4 or
// more (ResNet-9's, FashionCNN's second) take the Winograd F(2x2, 3x3) path
// of conv_winograd.cpp instead (2.25x fewer multiply-adds), and 3x3 planes
// (ResNet-9's last layers) its F(3x3, 3x3) tiles (3.24x fewer); where it pays
// is measured there (conv2d_winograd_pays). The bias gradient stays here.
#include <Eigen/Core>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cpu/eigen_scratch.h"
#include "kernels/cpu/conv_winograd.h"

namespace kiln::kernels {

namespace {

// The slots of this file's scratch buffers (eigen_scratch.h).
enum BufferSlot { kColumns, kColumnGrads, kPadded, kPartials, kProduct, kSlots };

// Whether the convolution reads its input directly as columns (1x1, stride 1, no padding).
bool is_pointwise(const Conv2dParams& p) {
  return p.kernel_h == 1 && p.kernel_w == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_h == 0 &&
         p.pad_w == 0;
}

int64_t padded_h(const Conv2dParams& p) { return p.in_h + 2 * p.pad_h; }
int64_t padded_w(const Conv2dParams& p) { return p.in_w + 2 * p.pad_w; }

// One group's planes (channels, H, W) copied into a zero-bordered
// (channels, H + 2*pad_h, W + 2*pad_w) buffer, so that im2col copies rows
// without bounds checks (3x faster than clipping every row segment); x itself
// when there is no padding.
template <typename T>
const T* padded_planes(const Conv2dParams& p, int64_t channels, const T* x) {
  if (p.pad_h == 0 && p.pad_w == 0) return x;
  const int64_t H = p.in_h, W = p.in_w, Hp = padded_h(p), Wp = padded_w(p);
  T* out = thread_buffer<T>(static_cast<size_t>(channels * Hp * Wp), kPadded);
  for (int64_t c = 0; c < channels; ++c) {
    T* plane = out + c * Hp * Wp;
    std::fill(plane, plane + p.pad_h * Wp, T(0));
    for (int64_t h = 0; h < H; ++h) {
      T* row = plane + (h + p.pad_h) * Wp;
      const T* src = x + (c * H + h) * W;
      for (int64_t w = 0; w < p.pad_w; ++w) row[w] = T(0);
      for (int64_t w = 0; w < W; ++w) row[p.pad_w + w] = src[w];
      for (int64_t w = p.pad_w + W; w < Wp; ++w) row[w] = T(0);
    }
    std::fill(plane + (H + p.pad_h) * Wp, plane + Hp * Wp, T(0));
  }
  return out;
}

// col (channels*kh*kw, OH*OW), rows `ld` apart, from padded planes (channels, Hp, Wp).
template <typename T>
void im2col(const Conv2dParams& p, int64_t channels, const T* padded, T* col, int64_t ld) {
  const int64_t OH = p.out_h, OW = p.out_w, Hp = padded_h(p), Wp = padded_w(p);
  const int64_t sh = p.stride_h, sw = p.stride_w;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t ki = 0; ki < p.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < p.kernel_w; ++kj) {
        T* row = col + ((c * p.kernel_h + ki) * p.kernel_w + kj) * ld;
        const T* base = padded + c * Hp * Wp + ki * p.dilation_h * Wp + kj * p.dilation_w;
        for (int64_t oh = 0; oh < OH; ++oh) {
          const T* src = base + oh * sh * Wp;
          T* dst = row + oh * OW;
          if (sw == 1) {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = src[ow];
          } else {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = src[ow * sw];
          }
        }
      }
    }
  }
}

// dx (channels, H, W) = the columns col (channels*kh*kw, OH*OW; rows `ld`
// apart) summed back, accumulated in a zeroed padded buffer (or dx itself
// without padding).
template <typename T>
void col2im(const Conv2dParams& p, int64_t channels, const T* col, T* dx, int64_t ld) {
  const int64_t OH = p.out_h, OW = p.out_w, H = p.in_h, W = p.in_w, Hp = padded_h(p), Wp = padded_w(p);
  const int64_t sh = p.stride_h, sw = p.stride_w;
  const bool padded = p.pad_h != 0 || p.pad_w != 0;
  T* acc = padded ? thread_buffer<T>(static_cast<size_t>(channels * Hp * Wp), kPadded) : dx;
  std::fill(acc, acc + channels * Hp * Wp, T(0));
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t ki = 0; ki < p.kernel_h; ++ki) {
      for (int64_t kj = 0; kj < p.kernel_w; ++kj) {
        const T* row = col + ((c * p.kernel_h + ki) * p.kernel_w + kj) * ld;
        T* base = acc + c * Hp * Wp + ki * p.dilation_h * Wp + kj * p.dilation_w;
        for (int64_t oh = 0; oh < OH; ++oh) {
          T* dst = base + oh * sh * Wp;
          const T* src = row + oh * OW;
          if (sw == 1) {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow] += src[ow];
          } else {
            for (int64_t ow = 0; ow < OW; ++ow) dst[ow * sw] += src[ow];
          }
        }
      }
    }
  }
  if (!padded) return;
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t h = 0; h < H; ++h) {
      const T* src = acc + (c * Hp + h + p.pad_h) * Wp + p.pad_w;
      T* dst = dx + (c * H + h) * W;
      for (int64_t w = 0; w < W; ++w) dst[w] = src[w];
    }
  }
}

// Samples per GEMM and per weight-gradient chunk. A layer with small output
// planes (ResNet-9's 512-channel 3x3 and 7x7 layers) gives per-sample
// products of few columns (P = 9), where Eigen's GEMM runs at a third of its
// peak and the weight gradient's reduction depth is P. Below kMinGemmColumns
// columns per sample, the columns of several samples go side by side into one
// product of up to kMaxGemmColumns columns. Measured on one core
// (bench_resnet9_conv, batch 128): the 3x3 layer's forward/backward went from
// 44%/33% of the GEMM floor to 84%/79%; the 7x7 layer's forward from 78% to
// 97%. Blocking 14x14 planes, or blocks of more columns, measured slower. The weight gradient is summed per chunk of samples and the
// chunks are added in order; the chunk count is a power of two (even work for
// 2^k threads), at most kMaxWeightChunks, and small enough that a chunk holds
// kMinGemmColumns columns. Everything depends only on the shape, so results do
// not depend on the thread count.
constexpr int64_t kMinGemmColumns = 100;
constexpr int64_t kMaxGemmColumns = 256;
constexpr int64_t kMaxWeightChunks = 16;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t weight_chunks(const Conv2dParams& p) {
  const int64_t P = p.out_h * p.out_w;
  const int64_t limit = std::min(p.batch, P >= kMinGemmColumns ? kMaxWeightChunks
                                                               : std::clamp<int64_t>(p.batch * P / kMinGemmColumns,
                                                                                     1, kMaxWeightChunks));
  int64_t chunks = 1;
  while (chunks * 2 <= limit) chunks *= 2;
  return chunks;
}
int64_t samples_per_chunk(const Conv2dParams& p) { return ceil_div(p.batch, weight_chunks(p)); }
int64_t samples_per_gemm(const Conv2dParams& p) {
  const int64_t P = p.out_h * p.out_w;
  if (P >= kMinGemmColumns) return 1;
  const int64_t per_chunk = samples_per_chunk(p);
  const int64_t cap = std::max<int64_t>(1, kMaxGemmColumns / P);
  return ceil_div(per_chunk, ceil_div(per_chunk, cap));  // equal blocks of at most `cap`
}

// Rows (rows, P) of `count` samples, `sample_stride` apart in `planes`, side by
// side in `block` (rows, count*P): gathered into the block, or scattered back.
template <typename T>
void gather_sample_rows(int64_t rows, int64_t P, int64_t count, int64_t sample_stride, const T* planes, T* block) {
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* plane_row = planes + s * sample_stride + r * P;
      std::copy(plane_row, plane_row + P, block + r * count * P + s * P);
    }
  }
}
template <typename T>
void scatter_sample_rows(int64_t rows, int64_t P, int64_t count, int64_t sample_stride, const T* block, T* planes) {
  for (int64_t s = 0; s < count; ++s) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* block_row = block + r * count * P + s * P;
      std::copy(block_row, block_row + P, planes + s * sample_stride + r * P);
    }
  }
}

// The columns (K, count*P; rows `ld` = count*P apart) of samples
// first..first+count of one group: im2col's, or the input planes themselves
// for a pointwise convolution (returned in place when count is 1).
template <typename T>
const T* gather_columns(const Conv2dParams& p, const T* x, int64_t first, int64_t count, int64_t group, T* col) {
  const int64_t Cg = p.in_channels / p.groups, HW = p.in_h * p.in_w, P = p.out_h * p.out_w, ld = count * P;
  const T* x_first = x + (first * p.in_channels + group * Cg) * HW;  // the first sample's (Cg, H, W)
  if (is_pointwise(p)) {
    if (count == 1) return x_first;
    gather_sample_rows(Cg, P, count, p.in_channels * HW, x_first, col);
    return col;
  }
  for (int64_t s = 0; s < count; ++s) {
    im2col(p, Cg, padded_planes(p, Cg, x_first + s * p.in_channels * HW), col + s * P, ld);
  }
  return col;
}

template <typename T>
void forward(const Conv2dParams& p, const T* x, const T* weight, const T* bias, T* y) {
  const int64_t G = p.groups, Cg = p.in_channels / G, Og = p.out_channels / G;
  const int64_t K = Cg * p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const int64_t block = samples_per_gemm(p), blocks = ceil_div(p.batch, block);
  const double work = conv2d_macs(p);
#pragma omp parallel for schedule(static) if (blocks > 1 && work > 1e6)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * block, count = std::min(block, p.batch - first), columns = count * P;
    T* col = thread_buffer<T>(static_cast<size_t>(K * columns), kColumns);
    for (int64_t g = 0; g < G; ++g) {
      const T* cols = gather_columns(p, x, first, count, g, col);
      T* y_group = y + (first * p.out_channels + g * Og) * P;  // (Og, P) of the first sample
      // One sample writes its output plane directly; several go through a block.
      T* product = count == 1 ? y_group : thread_buffer<T>(static_cast<size_t>(Og * columns), kProduct);
      MapRM<T>(product, Og, columns).noalias() = ConstMapRM<T>(weight + g * Og * K, Og, K) * ConstMapRM<T>(cols, K, columns);
      if (count > 1) scatter_sample_rows(Og, P, count, p.out_channels * P, product, y_group);
      if (bias == nullptr) continue;
      for (int64_t s = 0; s < count; ++s) {
        for (int64_t o = 0; o < Og; ++o) {
          const T b_value = bias[g * Og + o];
          T* row = y_group + s * p.out_channels * P + o * P;
          for (int64_t i = 0; i < P; ++i) row[i] += b_value;
        }
      }
    }
  }
}

template <typename T>
void backward(const Conv2dParams& p, const T* x, const T* weight, const T* dy, T* dx, T* dweight, T* dbias) {
  const int64_t G = p.groups, Cg = p.in_channels / G, Og = p.out_channels / G;
  const int64_t K = Cg * p.kernel_h * p.kernel_w, P = p.out_h * p.out_w, HW = p.in_h * p.in_w;
  const bool pointwise = is_pointwise(p);
  const int64_t weight_numel = p.out_channels * K;
  const double work = conv2d_macs(p);

  if (dbias != nullptr) {
#pragma omp parallel for schedule(static) if (work > 1e6)
    for (int64_t o = 0; o < p.out_channels; ++o) {
      T total = 0;
      for (int64_t n = 0; n < p.batch; ++n) {
        total += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(dy + (n * p.out_channels + o) * P, P).sum();
      }
      dbias[o] = total;
    }
  }
  if (dx == nullptr && dweight == nullptr) return;

  const int64_t per_chunk = samples_per_chunk(p), chunks = ceil_div(p.batch, per_chunk);
  const int64_t block = samples_per_gemm(p);
  // (chunks, O, K) partial weight gradients; chunk 0 writes dweight directly.
  // A buffer of the calling thread (kept between calls: a fresh one would
  // page-fault ~1 MB per call for FashionCNN's second layer).
  T* partials = dweight != nullptr ? thread_buffer<T>(static_cast<size_t>((chunks - 1) * weight_numel), kPartials)
                                   : nullptr;

#pragma omp parallel for schedule(static) if (p.batch > 1 && work > 1e6)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    T* dweight_chunk = nullptr;
    if (dweight != nullptr) {
      dweight_chunk = chunk == 0 ? dweight : partials + (chunk - 1) * weight_numel;
      std::fill(dweight_chunk, dweight_chunk + weight_numel, T(0));
    }
    const int64_t n_end = std::min(p.batch, (chunk + 1) * per_chunk);
    for (int64_t first = chunk * per_chunk; first < n_end; first += block) {
      const int64_t count = std::min(block, n_end - first), columns = count * P;
      for (int64_t g = 0; g < G; ++g) {
        // dy of the block's samples as one (Og, count*P) matrix.
        const T* dy_group = dy + (first * p.out_channels + g * Og) * P;
        if (count > 1) {
          T* gathered = thread_buffer<T>(static_cast<size_t>(Og * columns), kProduct);
          gather_sample_rows(Og, P, count, p.out_channels * P, dy_group, gathered);
          dy_group = gathered;
        }
        ConstMapRM<T> dout(dy_group, Og, columns);
        if (dweight_chunk != nullptr) {
          T* col = thread_buffer<T>(static_cast<size_t>(K * columns), kColumns);
          const T* cols = gather_columns(p, x, first, count, g, col);
          MapRM<T>(dweight_chunk + g * Og * K, Og, K).noalias() += dout * ConstMapRM<T>(cols, K, columns).transpose();
        }
        if (dx != nullptr) {
          T* dx_group = dx + (first * p.in_channels + g * Cg) * HW;  // the first sample's (Cg, H, W)
          ConstMapRM<T> w(weight + g * Og * K, Og, K);
          if (pointwise && count == 1) {
            MapRM<T>(dx_group, K, P).noalias() = w.transpose() * dout;
            continue;
          }
          T* dcol = thread_buffer<T>(static_cast<size_t>(K * columns), kColumnGrads);
          MapRM<T>(dcol, K, columns).noalias() = w.transpose() * dout;
          if (pointwise) {
            scatter_sample_rows(K, P, count, p.in_channels * HW, dcol, dx_group);
          } else {
            for (int64_t s = 0; s < count; ++s) col2im(p, Cg, dcol + s * P, dx_group + s * p.in_channels * HW, columns);
          }
        }
      }
    }
  }

  if (dweight != nullptr && chunks > 1) {
#pragma omp parallel for schedule(static) if (weight_numel * chunks > (1 << 16))
    for (int64_t i = 0; i < weight_numel; ++i) {
      T total = dweight[i];
      for (int64_t chunk = 1; chunk < chunks; ++chunk) total += partials[(chunk - 1) * weight_numel + i];
      dweight[i] = total;
    }
  }
}

}  // namespace

void conv2d_forward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight, const void* bias,
                        void* y) {
  if (conv2d_winograd_selected(p)) return conv2d_winograd_forward_cpu(dtype, p, x, weight, bias, y);
  dispatch_f32_f64(dtype, "conv2d (cpu kernel)", [&]<typename T>() {
    forward(p, static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias),
            static_cast<T*>(y));
  });
}

void conv2d_backward_cpu(DType dtype, const Conv2dParams& p, const void* x, const void* weight, const void* dy,
                         void* dx, void* dweight, void* dbias) {
  if (conv2d_winograd_selected(p) && (dx != nullptr || dweight != nullptr)) {
    conv2d_winograd_backward_cpu(dtype, p, x, weight, dy, dx, dweight);
    dx = dweight = nullptr;  // only the bias gradient is left
  }
  dispatch_f32_f64(dtype, "conv2d backward (cpu kernel)", [&]<typename T>() {
    backward(p, static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(dy),
             static_cast<T*>(dx), static_cast<T*>(dweight), static_cast<T*>(dbias));
  });
}

}  // namespace kiln::kernels
