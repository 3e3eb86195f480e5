// pool.cu's kernels (max_forward/backward, avg_forward/backward,
// adaptive_forward/backward) through the public entry points of
// kernels/pool.h, emulated, channels-last (NHWC) against kernels/cpu/pool.cpp
// (linked by run_kernels.sh) and against pool.cu's own NCHW instantiation on
// the same values. Every output starts as 0xff bytes (NaN; indices 0x7f7f7f7f).
//
// What must match, per case and dtype (f64, f32, f16, bf16):
//   y (and max's indices)  CUDA NHWC = CPU NHWC = CUDA NCHW = CPU NCHW, bit for
//                          bit: every kernel sums a window in the same row-major
//                          order in the same type and divides once.
//   dx                     CUDA NHWC = CUDA NCHW bit for bit (one gather, same
//                          order); CPU NHWC = CPU NCHW bit for bit (one scatter,
//                          same order); CUDA against CPU: max bit for bit (dy
//                          holds small integers, so any order of adds is exact),
//                          avg/adaptive within 2 u_T |dx| + 16 u_A max|dx| (the
//                          gather adds the covering windows in the opposite order).
// Shapes: odd H, W with no ceil mode (the last row/column dropped), channel
// counts 1, 3, 5, 17, 19, 33 (not a multiple of any vector width) and 16, 24,
// 64 (2x2 windows over 16-byte packs; also one element off alignment),
// overlapping windows (stride < kernel, adaptive output larger than the input),
// padding, dilation, windows wholly in the padding (index -1), NaNs in x.
//   test_pool   (no arguments)
#include "emu_test.h"
#include "emu_pool.inc"

#include <chrono>
#include <cstring>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

enum class Op { max, avg, adaptive };

struct Case {
  const char* name;
  Op op;
  int64_t n, c, h, w;
  Pool2dParams window;  // kernel, stride, padding, dilation, count_include_pad; out_h/out_w for adaptive
  bool nans = false;
  bool misaligned = false;  // NHWC x, dy, y, dx and indices one element past a 16-byte boundary
};

int64_t out_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (kernel - 1) - 1) / stride + 1;
}

Pool2dParams window(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph = 0, int64_t pw = 0, int64_t dh = 1,
                    int64_t dw = 1, bool count_include_pad = true) {
  Pool2dParams p;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.dilation_h = dh;
  p.dilation_w = dw;
  p.count_include_pad = count_include_pad;
  return p;
}

Pool2dParams adaptive(int64_t oh, int64_t ow) {
  Pool2dParams p;
  p.out_h = oh;
  p.out_w = ow;
  return p;
}

// (N, C, H, W) <-> (N, H, W, C) element offsets.
int64_t nchw_at(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C, int64_t H, int64_t W) {
  return ((n * C + c) * H + h) * W + w;
}
int64_t nhwc_at(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C, int64_t H, int64_t W) {
  return ((n * H + h) * W + w) * C + c;
}

// An NHWC buffer's values in NCHW order (as doubles), or copied into an NCHW buffer.
template <typename B>
std::vector<double> nchw_values_of_nhwc(const B& nhwc, int64_t N, int64_t C, int64_t H, int64_t W) {
  std::vector<double> out(static_cast<size_t>(N * C * H * W));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w)
          out[nchw_at(n, c, h, w, C, H, W)] = to_double(nhwc[nhwc_at(n, c, h, w, C, H, W)]);
  return out;
}
template <typename B, typename D>
void nhwc_to_nchw(const B& nhwc, D& nchw, int64_t N, int64_t C, int64_t H, int64_t W) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) nchw[nchw_at(n, c, h, w, C, H, W)] = nhwc[nhwc_at(n, c, h, w, C, H, W)];
}
template <typename B>
std::vector<double> values(const B& buffer) {
  std::vector<double> out(buffer.n);
  for (size_t i = 0; i < buffer.n; ++i) out[i] = to_double(buffer[i]);
  return out;
}

// Bit for bit (NaN matches NaN): compare() with zero tolerances scales by
// max|want|, which is inf where a window lay wholly in the padding.
void exact(const std::string& label, const char* what, const std::vector<double>& got,
           const std::vector<double>& want) {
  ++checks;
  long bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
    if (bad++ == 0) first = static_cast<long>(i);
  }
  if (got.size() != want.size() || bad > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld of %zu differ; first at %ld: %.9g vs %.9g\n", label.c_str(), what, bad, got.size(),
                first, first < 0 ? 0.0 : got[first], first < 0 ? 0.0 : want[first]);
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

template <typename T>
void run(const Case& k) {
  using A = typename Acc<T>::type;
  const auto start = std::chrono::steady_clock::now();
  const DType dtype = emu_dtype<T>();
  const int64_t N = k.n, C = k.c, H = k.h, W = k.w;
  Pool2dParams p = k.window;
  p.planes = N * C;
  p.in_h = H;
  p.in_w = W;
  if (k.op != Op::adaptive) {
    p.out_h = out_size(H, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h);
    p.out_w = out_size(W, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w);
  }
  const int64_t OH = p.out_h, OW = p.out_w, in_n = N * C * H * W, out_n = N * C * OH * OW;
  Pool2dParams nhwc = p, nchw = p;
  nhwc.channels_last = true;
  nhwc.channels = C;

  std::mt19937_64 engine(static_cast<uint64_t>(N * 1000003 + C * 7919 + H * 31 + W + static_cast<int>(k.op)));
  std::normal_distribution<double> normal;
  const size_t off = k.misaligned ? sizeof(T) : 0;
  emu::Buffer<T> x(in_n, "x", off, 0), x_nchw(in_n, "x_nchw", 0, 0), dy(out_n, "dy", off, 0),
      dy_nchw(out_n, "dy_nchw", 0, 0);
  for (int64_t i = 0; i < in_n; ++i) x[i] = from_double<T>(k.nans && engine() % 9 == 0 ? NAN : normal(engine));
  // Max: integers in [-3, 3], so that every sum of gradients is exact in any order.
  for (int64_t i = 0; i < out_n; ++i) {
    dy[i] = from_double<T>(k.op == Op::max ? static_cast<double>(static_cast<int>(engine() % 7) - 3) : normal(engine));
  }
  nhwc_to_nchw(x, x_nchw, N, C, H, W);
  nhwc_to_nchw(dy, dy_nchw, N, C, OH, OW);

  // g: CUDA emulated, c: CPU; _cl: NHWC, _nchw: NCHW.
  emu::Buffer<T> y_g(out_n, "y cuda nhwc", off), y_c(out_n, "y cpu nhwc"), y_g_nchw(out_n, "y cuda nchw"),
      y_c_nchw(out_n, "y cpu nchw");
  emu::Buffer<T> dx_g(in_n, "dx cuda nhwc", off), dx_c(in_n, "dx cpu nhwc"), dx_g_nchw(in_n, "dx cuda nchw"),
      dx_c_nchw(in_n, "dx cpu nchw");
  const size_t index_count = k.op == Op::max ? static_cast<size_t>(out_n) : 0;
  emu::Buffer<int32_t> i_g(index_count, "indices cuda nhwc", k.misaligned ? 4 : 0, 0x7f),
      i_c(index_count, "indices cpu nhwc", 0, 0x7f),
      i_g_nchw(index_count, "indices cuda nchw", 0, 0x7f), i_c_nchw(index_count, "indices cpu nchw", 0, 0x7f);
  switch (k.op) {
    case Op::max:
      max_pool2d_forward_cuda(dtype, nhwc, x.data, y_g.data, i_g.data, nullptr);
      max_pool2d_forward_cpu(dtype, nhwc, x.data, y_c.data, i_c.data);
      max_pool2d_forward_cuda(dtype, nchw, x_nchw.data, y_g_nchw.data, i_g_nchw.data, nullptr);
      max_pool2d_forward_cpu(dtype, nchw, x_nchw.data, y_c_nchw.data, i_c_nchw.data);
      max_pool2d_backward_cuda(dtype, nhwc, dy.data, i_g.data, dx_g.data, nullptr);
      max_pool2d_backward_cpu(dtype, nhwc, dy.data, i_c.data, dx_c.data);
      max_pool2d_backward_cuda(dtype, nchw, dy_nchw.data, i_g_nchw.data, dx_g_nchw.data, nullptr);
      max_pool2d_backward_cpu(dtype, nchw, dy_nchw.data, i_c_nchw.data, dx_c_nchw.data);
      break;
    case Op::avg:
      avg_pool2d_forward_cuda(dtype, nhwc, x.data, y_g.data, nullptr);
      avg_pool2d_forward_cpu(dtype, nhwc, x.data, y_c.data);
      avg_pool2d_forward_cuda(dtype, nchw, x_nchw.data, y_g_nchw.data, nullptr);
      avg_pool2d_forward_cpu(dtype, nchw, x_nchw.data, y_c_nchw.data);
      avg_pool2d_backward_cuda(dtype, nhwc, dy.data, dx_g.data, nullptr);
      avg_pool2d_backward_cpu(dtype, nhwc, dy.data, dx_c.data);
      avg_pool2d_backward_cuda(dtype, nchw, dy_nchw.data, dx_g_nchw.data, nullptr);
      avg_pool2d_backward_cpu(dtype, nchw, dy_nchw.data, dx_c_nchw.data);
      break;
    case Op::adaptive:
      adaptive_avg_pool2d_forward_cuda(dtype, nhwc, x.data, y_g.data, nullptr);
      adaptive_avg_pool2d_forward_cpu(dtype, nhwc, x.data, y_c.data);
      adaptive_avg_pool2d_forward_cuda(dtype, nchw, x_nchw.data, y_g_nchw.data, nullptr);
      adaptive_avg_pool2d_forward_cpu(dtype, nchw, x_nchw.data, y_c_nchw.data);
      adaptive_avg_pool2d_backward_cuda(dtype, nhwc, dy.data, dx_g.data, nullptr);
      adaptive_avg_pool2d_backward_cpu(dtype, nhwc, dy.data, dx_c.data);
      adaptive_avg_pool2d_backward_cuda(dtype, nchw, dy_nchw.data, dx_g_nchw.data, nullptr);
      adaptive_avg_pool2d_backward_cpu(dtype, nchw, dy_nchw.data, dx_c_nchw.data);
      break;
  }

  char label[200];
  std::snprintf(label, sizeof label, "%-4s %-44s (%ld, %ld, %ld, %ld) -> %ldx%ld", name_of<T>(), k.name, N, C, H, W,
                OH, OW);
  const std::vector<double> y = values(y_g), dx = values(dx_g);
  exact(label, "y: cuda nhwc vs cpu nhwc", y, values(y_c));
  exact(label, "y: cuda nhwc vs cuda nchw", nchw_values_of_nhwc(y_g, N, C, OH, OW), values(y_g_nchw));
  exact(label, "y: cpu nhwc vs cpu nchw", nchw_values_of_nhwc(y_c, N, C, OH, OW), values(y_c_nchw));
  if (k.op == Op::max) {
    exact(label, "indices: cuda nhwc vs cpu nhwc", values(i_g), values(i_c));
    exact(label, "indices: cuda nhwc vs cuda nchw", nchw_values_of_nhwc(i_g, N, C, OH, OW), values(i_g_nchw));
    exact(label, "indices: cpu nhwc vs cpu nchw", nchw_values_of_nhwc(i_c, N, C, OH, OW), values(i_c_nchw));
  }
  double e_dx = 0;
  if (k.op == Op::max) {
    exact(label, "dx: cuda nhwc vs cpu nhwc", dx, values(dx_c));
  } else {
    e_dx = compare(label, "dx: cuda nhwc vs cpu nhwc", dx, values(dx_c), 2 * roundoff<T>(), 16 * roundoff<A>());
  }
  exact(label, "dx: cuda nhwc vs cuda nchw", nchw_values_of_nhwc(dx_g, N, C, H, W), values(dx_g_nchw));
  exact(label, "dx: cpu nhwc vs cpu nchw", nchw_values_of_nhwc(dx_c, N, C, H, W), values(dx_c_nchw));
  // NaN matches NaN above, so an output no kernel wrote (0xff bytes: NaN) would
  // pass: every element must be written (y may hold NaN only where x does).
  ++checks;
  long unwritten = 0;
  for (double v : dx) unwritten += std::isnan(v);
  for (double v : y) unwritten += std::isnan(v) && !k.nans;
  for (size_t i = 0; i < index_count; ++i) unwritten += i_g[i] == 0x7f7f7f7f;
  if (unwritten > 0) {
    ++failures;
    std::printf("FAIL %s: %ld outputs not written (NaN or 0x7f7f7f7f)\n", label, unwritten);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s  dx cuda-cpu err/scale %.1e (%.2f s)\n", label, e_dx, seconds);
  std::fflush(stdout);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const std::vector<Case> cases = {
      {"max 2x2", Op::max, 2, 5, 7, 9, window(2, 2, 2, 2)},
      {"max 2x2, 64 channels", Op::max, 1, 64, 8, 8, window(2, 2, 2, 2)},
      {"max 2x2, one channel", Op::max, 3, 1, 6, 7, window(2, 2, 2, 2)},
      // 16 and 24 channels: packs of 16 bytes in every dtype (pool.cu's packed 2x2 kernels), odd sizes
      // (inputs in no window), NaNs, and the same one element off a 16-byte boundary (the scalar kernels).
      {"max 2x2 packed, 7x9", Op::max, 2, 16, 7, 9, window(2, 2, 2, 2)},
      {"max 2x2 packed, 24 channels, NaNs", Op::max, 1, 24, 6, 5, window(2, 2, 2, 2), true},
      {"max 2x2 packed, misaligned", Op::max, 2, 16, 7, 9, window(2, 2, 2, 2), false, true},
      {"max 3x3 stride 2 padding 1", Op::max, 2, 19, 9, 7, window(3, 3, 2, 2, 1, 1)},
      {"max 3x3 stride 1 (9 windows per input)", Op::max, 1, 6, 6, 5, window(3, 3, 1, 1)},
      {"max 3x3 stride 1, NaNs", Op::max, 1, 5, 6, 5, window(3, 3, 1, 1), true},
      {"max 2x3 stride (1, 2) padding (1, 0) dilation 2", Op::max, 2, 3, 7, 8, window(2, 3, 1, 2, 1, 0, 2, 2)},
      {"max windows wholly in the padding", Op::max, 2, 4, 1, 3, window(1, 2, 1, 1, 0, 3, 1, 5)},
      {"avg 2x2", Op::avg, 2, 5, 7, 9, window(2, 2, 2, 2)},
      {"avg 3x3 stride 2 padding 1", Op::avg, 2, 19, 9, 7, window(3, 3, 2, 2, 1, 1)},
      {"avg 3x3 stride 2 padding 1, padding not counted", Op::avg, 2, 19, 9, 7,
       window(3, 3, 2, 2, 1, 1, 1, 1, false)},
      {"avg 3x2 stride 1 padding 1", Op::avg, 1, 17, 6, 5, window(3, 2, 1, 1, 1, 1)},
      {"adaptive 3x4", Op::adaptive, 2, 5, 7, 9, adaptive(3, 4)},
      {"adaptive 1x1", Op::adaptive, 2, 33, 5, 5, adaptive(1, 1)},
      {"adaptive 4x10 from 7x9 (overlapping)", Op::adaptive, 1, 3, 7, 9, adaptive(4, 10)},
  };
  // Every case twice: FastDivmod indexing (what launches below 2^30 elements take), then 64-bit division.
  for_each_index_path([&] {
    for (const Case& c : cases) {
      run<double>(c);
      run<float>(c);
      run<__half>(c);
      run<__nv_bfloat16>(c);
    }
  });
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
