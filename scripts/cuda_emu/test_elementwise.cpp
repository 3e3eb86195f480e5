// The CUDA elementwise launcher (kernels/cuda/elementwise_launch.cuh:
// contiguous_kernel, strided_kernel) through the public entry points
// unary_cuda / binary_cuda / where_cuda (elementwise.cu, elementwise_binary.cu)
// and copy_cuda (copy.cu: casts, transposes), emulated, against the CPU entry points
// (kernels/cpu/elementwise.cpp, elementwise_binary.cpp, copy.cpp; linked by
// run_kernels.sh) on the same IterShape / Operands, built as the core builds
// them (core/ops/broadcast.cpp: broadcast strides 0, then
// iterate_in_memory_order, copied below).
//
// What must match, per element written:
//   CUDA vs the scalar formula  bit for bit: cpu::elementwise_loop over the same
//     math::dispatch_* functors (elementwise_math.h), i.e. the CPU's strided path.
//   CUDA vs unary_cpu/binary_cpu/where_cpu/copy_cpu  bit for bit, except
//     - where the CPU takes its Eigen packet path (dense f32/f16/bf16 exp, gelu,
//       tanh, ..., gelu_backward: a different exp/erf/tanh than libm's): within
//       rtol |want| + 2^-20 S, rtol 2^-18 (f32) / one 16-bit ulp, S = max|want|
//       (gelu's 1 + erf and gelu_backward's cdf + x pdf cancel);
//     - floating affine, add and gelu_backward: the CPU objects are built as the
//       project builds them (-O2 -march=x86-64-v3, g++'s default
//       -ffp-contract=fast), so x * s0 + s1 becomes an FMA there (this driver
//       and the emulated kernels have no FMA): within 4 u (|want| + S), 16-bit
//       one ulp + 2^-22 S.
//   NaN matches NaN (the 16-bit conversions' NaN payloads differ: kiln's Half
//   and BFloat16 vs cuda_fp16/cuda_bf16), but a NaN left by the 0xff poison is
//   a failure; elements not written (gaps of a sliced output) must keep their
//   poison (or, in place, their input bytes).
// Not emulated: nvcc contracts a * b + c into an FMA by default (Add's
// a + alpha * b, Affine): on a GPU float results may differ from the CPU in
// the last bit; and the device's expf/erff/tanhf are not libm's.
// Cases: dense lengths 0, 1, 3, 7, 8, 9, 1023, 4097 with each operand moved
// by every element offset below 16 bytes (the vector path needs all aligned),
// in place; broadcasting (a row, a column, a scalar, a per-channel bias of an
// NHWC tensor); a transposed input; sliced views with gaps (input and output);
// channels-last 4-D output with row-major inputs and the reverse, both NHWC
// (walked in memory order: dense); 0-size and 1-element shapes; dtypes f32,
// f64, f16, bf16, i32, i64, u8, bool; ops relu, gelu, exp, tanh, affine,
// clamp, isfinite, gt_scalar, add (alpha), mul, div, maximum, lt, eq,
// gelu_backward, relu_backward, where; casts between every dtype pair (dense
// vector path, strided, same-dtype strided words, same-dtype transposes through
// shared-memory tiles); mixed input dtypes (must
// throw, as on the CPU); the grid-stride loops with a small grid (direct
// launches of contiguous_kernel / strided_kernel). Outputs start as 0xff.
//   test_elementwise   (no arguments; EMU_VERBOSE=1 prints each case before it runs)
#include "emu_storage.h"
#include "emu_test.h"
#include "emu_elementwise.inc"
#include "emu_elementwise_binary.inc"
#include "emu_copy.inc"
#include "kernels/copy.h"
#include "kernels/cpu/elementwise_loop.h"

#include <optional>
#include <chrono>
#include <memory>
#include <numeric>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

// ---------------------------------------------------------------- views and storage

struct View {
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
};

int64_t numel_of(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}
View contiguous(std::vector<int64_t> shape) {
  View v{shape, std::vector<int64_t>(shape.size()), 0};
  int64_t s = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    v.strides[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return v;
}
View channels_last(std::vector<int64_t> shape) {  // core/tensor.cpp's channels_last_strides
  const int64_t C = std::max<int64_t>(shape[1], 1), H = std::max<int64_t>(shape[2], 1),
                W = std::max<int64_t>(shape[3], 1);
  return View{shape, {H * W * C, 1, W * C, C}, 0};
}
View transposed(View v, int a, int b) {
  std::swap(v.shape[a], v.shape[b]);
  std::swap(v.strides[a], v.strides[b]);
  return v;
}
View sliced(View v, int dim, int64_t start, int64_t stop, int64_t step) {
  v.offset += start * v.strides[dim];
  v.shape[dim] = (stop - start + step - 1) / step;
  v.strides[dim] *= step;
  return v;
}
// Elements of storage the view reaches.
int64_t extent(const View& v) {
  if (numel_of(v.shape) == 0) return v.offset;
  int64_t last = v.offset;
  for (size_t d = 0; d < v.shape.size(); ++d) last += (v.shape[d] - 1) * v.strides[d];
  return last + 1;
}

// Values: floats mostly 2 N(0, 1), some from a small set (ties for the comparisons), some special
// (NaN, +-inf, -0, huge, subnormal); integers small (no overflow: the CPU's is UB); u8 and bool
// non-negative. `plain`: finite, in [-40, 40] (casts to integer types: out of range is UB).
double draw(DType t, std::mt19937_64& engine, bool plain, bool non_negative) {
  std::normal_distribution<double> normal;
  static const double ties[] = {-1, 0, 0.5, 1, 2, -2.5};
  static const double specials[] = {NAN, -NAN, INFINITY, -INFINITY, -0.0, 1e30, -1e30, 70000, 1e-40, 100, -100};
  const uint64_t r = engine() % 16;
  double v;
  if (t == DType::b8) return static_cast<double>(engine() % 2);
  if (!is_floating(t) || plain) {
    v = static_cast<double>(static_cast<int64_t>(engine() % 81) - 40);
    if (plain && is_floating(t) && r < 8) v += 0.25 * static_cast<double>(engine() % 4);
  } else if (r == 0) {
    v = specials[engine() % std::size(specials)];
  } else if (r < 4) {
    v = ties[engine() % std::size(ties)];
  } else {
    v = 2 * normal(engine);
  }
  if (non_negative || t == DType::u8) v = std::abs(v);
  return v;
}

void fill_values(Storage& s, uint64_t seed, bool plain, bool non_negative) {
  std::mt19937_64 engine(seed);
  for (int64_t i = 0; i < s.count; ++i) put(s.dtype, s.at(i), draw(s.dtype, engine, plain, non_negative));
}

// ---------------------------------------------------------------- operands as the core builds them

Operand operand_of(const View& v, const Storage& s, const std::vector<int64_t>& out_shape) {
  Operand o;
  o.data = s.at(v.offset);
  o.dtype = s.dtype;
  const size_t lead = out_shape.size() - v.shape.size();
  for (size_t i = 0; i < v.shape.size(); ++i) {
    EMU_REQUIRE(v.shape[i] == out_shape[lead + i] || v.shape[i] == 1, "a view that does not broadcast");
    o.strides[lead + i] = v.shape[i] == 1 ? 0 : v.strides[i];
  }
  return o;
}

// core/ops/broadcast.cpp's iterate_in_memory_order, verbatim (core is not linked here).
void iterate_in_memory_order(IterShape& shape, Operand* operands, int count) {
  const int ndim = shape.ndim;
  const int64_t* out_strides = operands[0].strides;
  bool in_order = true;
  for (int d = 1; d < ndim && in_order; ++d) in_order = out_strides[d - 1] >= out_strides[d];
  if (in_order) return;
  int order[kMaxDims];
  for (int d = 0; d < ndim; ++d) order[d] = d;
  std::stable_sort(order, order + ndim, [&](int a, int b) { return out_strides[a] > out_strides[b]; });
  const IterShape before = shape;
  for (int d = 0; d < ndim; ++d) shape.sizes[d] = before.sizes[order[d]];
  for (int k = 0; k < count; ++k) {
    int64_t strides[kMaxDims];
    for (int d = 0; d < ndim; ++d) strides[d] = operands[k].strides[order[d]];
    for (int d = 0; d < ndim; ++d) operands[k].strides[d] = strides[d];
  }
}

// ---------------------------------------------------------------- ops

enum class Kind { unary, binary, where, copy };
enum class Tol { exact, eigen, fma };
struct Op {
  const char* name;
  Kind kind;
  UnaryOp unary = UnaryOp::neg;
  BinaryOp binary = BinaryOp::add;
  double s0 = 0, s1 = 0;
};

bool floating_only(const Op& op) {
  if (op.kind == Kind::unary) {
    return !is_predicate(op.unary) && op.unary != UnaryOp::relu && op.unary != UnaryOp::affine &&
           op.unary != UnaryOp::clamp && op.unary != UnaryOp::neg && op.unary != UnaryOp::abs;
  }
  if (op.kind == Kind::binary) {
    return !is_predicate(op.binary) && op.binary != BinaryOp::add && op.binary != BinaryOp::mul &&
           op.binary != BinaryOp::maximum && op.binary != BinaryOp::minimum;
  }
  return false;
}
bool applies(const Op& op, DType t) {
  if (floating_only(op)) return is_floating(t);
  if (t == DType::b8) return op.kind == Kind::where || op.kind == Kind::copy || (op.kind == Kind::unary && is_predicate(op.unary)) ||
                             (op.kind == Kind::binary && is_predicate(op.binary));
  return true;
}
DType out_dtype(const Op& op, DType in) {
  if (op.kind == Kind::unary && is_predicate(op.unary)) return DType::b8;
  if (op.kind == Kind::binary && is_predicate(op.binary)) return DType::b8;
  return in;
}
// The ops for which the CPU entry point takes Eigen's packet math on dense f32/f16/bf16.
bool eigen_dense(const Op& op) {
  if (op.kind == Kind::unary) {
    switch (op.unary) {
      case UnaryOp::exp: case UnaryOp::log: case UnaryOp::tanh: case UnaryOp::sin: case UnaryOp::cos:
      case UnaryOp::sigmoid: case UnaryOp::silu: case UnaryOp::gelu: case UnaryOp::gelu_tanh: return true;
      default: return false;
    }
  }
  if (op.kind == Kind::binary) {
    switch (op.binary) {
      case BinaryOp::gelu_backward: case BinaryOp::gelu_tanh_backward: case BinaryOp::silu_backward:
      case BinaryOp::tanh_backward: case BinaryOp::sigmoid_backward: return true;
      default: return false;
    }
  }
  return false;
}

// Formulas with a multiply-add that g++ -march=x86-64-v3 contracts into an FMA in the CPU objects.
bool contractible(const Op& op) {
  return (op.kind == Kind::unary && op.unary == UnaryOp::affine) ||
         (op.kind == Kind::binary && (op.binary == BinaryOp::add || op.binary == BinaryOp::gelu_backward));
}

// The scalar-only scalars of integer inputs: affine/add must stay integral.
Op for_dtype(Op op, DType t) {
  if (!is_floating(t)) {
    if (op.kind == Kind::unary && op.unary == UnaryOp::affine) op.s0 = 3, op.s1 = -2;
    if (op.kind == Kind::unary && op.unary == UnaryOp::clamp) op.s0 = -5, op.s1 = 7;
    if (op.kind == Kind::binary && op.binary == BinaryOp::add) op.s0 = 2;
  }
  return op;
}

void call(bool cuda, const Op& op, const IterShape& shape, const Operand* o) {
  switch (op.kind) {
    case Kind::unary:
      if (cuda) unary_cuda(op.unary, shape, o[0], o[1], op.s0, op.s1, nullptr);
      else unary_cpu(op.unary, shape, o[0], o[1], op.s0, op.s1);
      break;
    case Kind::binary:
      if (cuda) binary_cuda(op.binary, shape, o[0], o[1], o[2], op.s0, op.s1, nullptr);
      else binary_cpu(op.binary, shape, o[0], o[1], o[2], op.s0, op.s1);
      break;
    case Kind::where:
      if (cuda) where_cuda(shape, o[0], o[1], o[2], o[3], nullptr);
      else where_cpu(shape, o[0], o[1], o[2], o[3]);
      break;
    case Kind::copy:
      if (cuda) copy_cuda(shape, o[0], o[1], nullptr);
      else copy_cpu(shape, o[0], o[1]);
      break;
  }
}

// The formula alone: cpu::elementwise_loop over the functors of elementwise_math.h.
void call_scalar(const Op& op, const IterShape& shape, const Operand* o) {
  switch (op.kind) {
    case Kind::unary:
      math::dispatch_unary(op.unary, o[1].dtype, op.s0, op.s1, [&]<typename Out, typename In>(auto f) {
        cpu::elementwise_loop<Out, In>(shape, o, f);
      });
      break;
    case Kind::binary:
      if (is_mixed_add(op.binary, o[0].dtype, o[1].dtype, o[2].dtype)) {
        // Written out, not through dispatch_mixed_add (which both entry points share): each
        // input read as its own type and widened, then a + alpha * b in float.
        const float alpha = static_cast<float>(op.s0);
        const auto add = [alpha](float a, float b) { return a + alpha * b; };
        const DType a = o[1].dtype, b = o[2].dtype;
        if (a == DType::f32 && b == DType::bf16) cpu::elementwise_loop<float, float, BFloat16>(shape, o, add);
        if (a == DType::f32 && b == DType::f16) cpu::elementwise_loop<float, float, Half>(shape, o, add);
        if (a == DType::bf16 && b == DType::f32) cpu::elementwise_loop<float, BFloat16, float>(shape, o, add);
        if (a == DType::f16 && b == DType::f32) cpu::elementwise_loop<float, Half, float>(shape, o, add);
        break;
      }
      math::dispatch_binary(op.binary, o[1].dtype, op.s0, op.s1, [&]<typename Out, typename A, typename B>(auto f) {
        cpu::elementwise_loop<Out, A, B>(shape, o, f);
      });
      break;
    case Kind::where:
      math::dispatch_where(o[2].dtype, [&]<typename Out, typename... In>(auto f) {
        cpu::elementwise_loop<Out, In...>(shape, o, f);
      });
      break;
    case Kind::copy: copy_cpu(shape, o[0], o[1]); break;
  }
}

// ---------------------------------------------------------------- comparison

// got against want over the storage: written elements equal (bit for bit, or NaN for NaN with
// got not the poison, or within rtol |want| + atol when tolerance), the rest as `original`.
void compare_storage(const std::string& label, const char* what, const Storage& got, const Storage& want,
                     const std::vector<char>& written, const Storage* original, Tol tol) {
  ++checks;
  const DType t = got.dtype;
  const size_t size = dtype_size(t);
  const bool tolerance = tol != Tol::exact && is_floating(t);
  double rtol = 0, atol = 0;
  if (tolerance) {
    double scale = 0;
    for (int64_t i = 0; i < want.count; ++i) {
      const double w = get(t, want.at(i));
      if (written[static_cast<size_t>(i)] && std::isfinite(w)) scale = std::max(scale, std::abs(w));
    }
    const double u = t == DType::f64 ? std::ldexp(1.0, -53) : t == DType::f32 ? std::ldexp(1.0, -24)
                     : t == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    const bool wide = t == DType::f32 || t == DType::f64;
    if (tol == Tol::eigen) {
      rtol = wide ? std::ldexp(1.0, -18) : 2 * u;
      atol = std::ldexp(1.0, -20) * scale;
    } else {
      rtol = wide ? 4 * u : 2 * u;
      atol = (wide ? 4 * u : std::ldexp(1.0, -22)) * scale;
    }
  }
  long bad = 0, first = -1;
  const char* why = "";
  for (int64_t i = 0; i < got.count; ++i) {
    const unsigned char* g = got.at(i);
    const char* wrong = nullptr;
    if (!written[static_cast<size_t>(i)]) {
      const bool kept = original != nullptr ? std::memcmp(g, original->at(i), size) == 0 : all_ff(g, size);
      if (!kept) wrong = "an element outside the output view was written";
    } else if (std::memcmp(g, want.at(i), size) != 0) {
      const double a = get(t, g), b = get(t, want.at(i));
      if (std::isnan(a) && std::isnan(b)) {
        if (all_ff(g, size) && !all_ff(want.at(i), size)) wrong = "not written (the poison)";
      } else if (!(tolerance && std::isfinite(a) && std::isfinite(b) && std::abs(a - b) <= rtol * std::abs(b) + atol)) {
        wrong = "differs";
      }
    }
    if (wrong != nullptr && bad++ == 0) {
      first = i;
      why = wrong;
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld of %ld elements wrong; first at %ld (%s): %.9g vs %.9g\n", label.c_str(), what, bad,
                static_cast<long>(got.count), first, why, get(t, got.at(first)), get(t, want.at(first)));
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

// ---------------------------------------------------------------- one case

struct Layout {
  std::string name;
  View out;
  std::vector<View> in;           // one per input (where: condition, a, b)
  size_t misalign_out = 0;        // bytes past 16 of each storage's start
  std::vector<size_t> misalign_in;
  bool in_place = false;          // the output is input 0 (same view and storage)
};

long cases_run = 0, vector_path_cases = 0;

// True when the launcher takes contiguous_kernel: all dense after coalescing, every pointer
// aligned to its Pack (16 bytes each; 16/max(sizes) elements).
bool takes_vector_path(IterShape shape, const Operand* given, int count) {
  Operand ops[kMaxOperands];
  for (int k = 0; k < count; ++k) ops[k] = given[k];
  coalesce(shape, ops, count);
  if (!all_contiguous(shape, ops, count) || shape.numel() == 0) return false;
  size_t largest = 1;
  for (int k = 0; k < count; ++k) largest = std::max(largest, dtype_size(ops[k].dtype));
  const size_t vector = 16 / largest;
  for (int k = 0; k < count; ++k) {
    if (reinterpret_cast<uintptr_t>(ops[k].data) % (vector * dtype_size(ops[k].dtype)) != 0) return false;
  }
  return true;
}

// second_in: input 1's dtype when it differs from in_t (add of float32 and a 16-bit type: a float32 output).
void run(const Op& given, const Layout& l, DType in_t, DType out_t_copy = DType::f32,
         std::optional<DType> second_in = std::nullopt) {
  const Op op = for_dtype(given, in_t);
  const DType out_t = second_in ? DType::f32 : op.kind == Kind::copy ? out_t_copy : out_dtype(op, in_t);
  const int inputs = static_cast<int>(l.in.size());
  const int count = 1 + inputs;
  ++cases_run;
  // Inputs (read by all three computations).
  std::vector<std::unique_ptr<Storage>> in;
  const uint64_t seed = std::hash<std::string>{}(l.name + op.name) + static_cast<uint64_t>(in_t) * 131;
  for (int k = 0; k < inputs; ++k) {
    const DType t = op.kind == Kind::where && k == 0 ? DType::b8 : k == 1 && second_in ? *second_in : in_t;
    const size_t misalign = k < static_cast<int>(l.misalign_in.size()) ? l.misalign_in[k] : 0;
    in.push_back(std::make_unique<Storage>(t, extent(l.in[k]), "input " + std::to_string(k), misalign));
    // Casts to integer types: finite values in range (out of range is UB on the CPU);
    // to u8 also non-negative.
    const bool plain = op.kind == Kind::copy && !is_floating(out_t);
    fill_values(*in.back(), seed + static_cast<uint64_t>(k), plain, plain && out_t == DType::u8);
  }
  // Outputs: CUDA, CPU entry point, scalar formula; poisoned, or copies of input 0 when in place.
  const int64_t out_n = l.in_place ? in[0]->count : extent(l.out);
  const size_t out_misalign = l.in_place ? (l.misalign_in.empty() ? 0 : l.misalign_in[0]) : l.misalign_out;
  Storage out_g(out_t, out_n, "out cuda", out_misalign), out_c(out_t, out_n, "out cpu", out_misalign),
      out_s(out_t, out_n, "out scalar", out_misalign);
  if (l.in_place) {
    EMU_REQUIRE(in[0]->dtype == out_t, "in place needs the output dtype");
    for (Storage* s : {&out_g, &out_c, &out_s}) std::memcpy(s->at(0), in[0]->at(0), out_n * dtype_size(out_t));
  }
  const View& out_view = l.in_place ? l.in[0] : l.out;
  std::vector<char> written(static_cast<size_t>(out_n), 0);
  {
    const int64_t n = numel_of(out_view.shape);
    for (int64_t i = 0; i < n; ++i) {
      int64_t rest = i, at = out_view.offset;
      for (int d = static_cast<int>(out_view.shape.size()) - 1; d >= 0; --d) {
        at += rest % out_view.shape[d] * out_view.strides[d];
        rest /= out_view.shape[d];
      }
      written[static_cast<size_t>(at)] = 1;
    }
  }

  IterShape shape;
  shape.ndim = static_cast<int>(out_view.shape.size());
  for (int d = 0; d < shape.ndim; ++d) shape.sizes[d] = out_view.shape[d];
  Operand ops[kMaxOperands];
  ops[0] = operand_of(out_view, out_g, out_view.shape);
  // In place: the output also reads itself (input 0 = the output's storage).
  for (int k = 0; k < inputs; ++k) ops[k + 1] = operand_of(l.in[k], l.in_place && k == 0 ? out_g : *in[k], out_view.shape);
  iterate_in_memory_order(shape, ops, count);
  Operand ops_c[kMaxOperands], ops_s[kMaxOperands];
  const auto rebase = [&](Operand* o, const Storage& out) {
    for (int k = 0; k < count; ++k) o[k] = ops[k];
    const ptrdiff_t shift = out.at(0) - out_g.at(0);
    o[0].data = static_cast<unsigned char*>(ops[0].data) + shift;
    if (l.in_place) o[1].data = static_cast<unsigned char*>(ops[1].data) + shift;
  };
  rebase(ops_c, out_c);
  rebase(ops_s, out_s);
  const bool vector = takes_vector_path(shape, ops, count);
  vector_path_cases += vector;

  char label[256];
  const std::string in_text =
      std::string(dtype_name(in_t)) + (second_in ? std::string("+") + std::string(dtype_name(*second_in)) : "");
  std::snprintf(label, sizeof label, "%-14s %-5s->%-5s %-46s%s", op.name, in_text.c_str(), dtype_name(out_t).data(),
                l.name.c_str(), vector ? " [vec]" : "");
  if (std::getenv("EMU_VERBOSE")) {
    std::fprintf(stderr, "%s: shape", label);
    for (int d = 0; d < shape.ndim; ++d) std::fprintf(stderr, " %ld", static_cast<long>(shape.sizes[d]));
    for (int k = 0; k < count; ++k) {
      std::fprintf(stderr, "; strides");
      for (int d = 0; d < shape.ndim; ++d) std::fprintf(stderr, " %ld", static_cast<long>(ops[k].strides[d]));
    }
    std::fprintf(stderr, "\n");
  }
  call(true, op, shape, ops);
  call(false, op, shape, ops_c);
  call_scalar(op, shape, ops_s);
  // The CPU took Eigen's packet math where its dense test (coalesce, all_contiguous) held.
  IterShape dense_shape = shape;
  Operand dense_ops[kMaxOperands];
  for (int k = 0; k < count; ++k) dense_ops[k] = ops[k];
  coalesce(dense_shape, dense_ops, count);
  const bool cpu_eigen = eigen_dense(op) && (in_t == DType::f32 || in_t == DType::f16 || in_t == DType::bf16) &&
                         all_contiguous(dense_shape, dense_ops, count);
  const Storage* original = l.in_place ? in[0].get() : nullptr;
  const Tol tol = cpu_eigen ? Tol::eigen : contractible(op) ? Tol::fma : Tol::exact;
  compare_storage(label, "cuda vs scalar formula", out_g, out_s, written, original, Tol::exact);
  compare_storage(label,
                  tol == Tol::eigen ? "cuda vs cpu (Eigen path: tolerance)"
                  : tol == Tol::fma ? "cuda vs cpu (FMA there: tolerance)" : "cuda vs cpu",
                  out_g, out_c, written, original, tol);
}

// ---------------------------------------------------------------- layouts

std::vector<View> same(const View& v, int inputs) { return std::vector<View>(static_cast<size_t>(inputs), v); }

// Dense lengths with each operand's start moved by whole elements below 16 bytes.
std::vector<Layout> dense_layouts(int inputs, size_t element, bool all_offsets) {
  std::vector<Layout> out;
  for (int64_t n : {0, 1, 3, 7, 8, 9, 1023, 4097}) {
    const View v = contiguous({n});
    out.push_back({"dense n=" + std::to_string(n), v, same(v, inputs), 0, {}});
    const bool offsets = all_offsets && (n == 9 || n == 1023 || n == 4097);
    if (!offsets) continue;
    const size_t last = n == 4097 ? element : 16 - element;  // 4097: one element off only
    for (size_t off = element; off <= last; off += element) {
      out.push_back({"dense n=" + std::to_string(n) + " out +" + std::to_string(off) + "B", v, same(v, inputs), off, {}});
      for (int k = 0; k < inputs; ++k) {
        std::vector<size_t> m(static_cast<size_t>(inputs), 0);
        m[k] = off;
        out.push_back({"dense n=" + std::to_string(n) + " in" + std::to_string(k) + " +" + std::to_string(off) + "B", v,
                       same(v, inputs), 0, m});
      }
      out.push_back({"dense n=" + std::to_string(n) + " all +" + std::to_string(off) + "B", v, same(v, inputs), off,
                     std::vector<size_t>(static_cast<size_t>(inputs), off)});
    }
  }
  // In place (out = input 0), aligned and one element off.
  const View v = contiguous({1023});
  out.push_back({"in place dense n=1023", v, same(v, inputs), 0, {}, true});
  out.push_back({"in place dense n=1023 +1", v, same(v, inputs), 0, std::vector<size_t>(static_cast<size_t>(inputs), element), true});
  return out;
}

// Strided layouts: broadcasting, transposed, sliced, channels-last, 0-size, 1 element.
std::vector<Layout> strided_layouts(int inputs) {
  std::vector<Layout> out;
  const auto with = [&](std::string name, View o, std::vector<View> in) {
    in.resize(static_cast<size_t>(inputs), in.back());
    out.push_back({std::move(name), std::move(o), std::move(in), 0, {}});
  };
  const View m = contiguous({5, 37});
  with("row vector (37) vs (5, 37)", m, {m, contiguous({37}), m});
  with("(5, 37) vs row vector (37)", m, {contiguous({37}), m, m});
  with("column (5, 1) vs (5, 37)", m, {m, contiguous({5, 1}), contiguous({37})});
  with("scalar () vs (5, 37)", m, {m, contiguous({}), contiguous({1, 1})});
  with("all scalar ()", contiguous({}), {contiguous({})});
  with("transposed (37, 5)^T", m, {transposed(contiguous({37, 5}), 0, 1), m});
  with("both transposed", m, {transposed(contiguous({37, 5}), 0, 1), transposed(contiguous({37, 5}), 0, 1)});
  with("sliced [:, 2:39] of (5, 41)", m, {sliced(contiguous({5, 41}), 1, 2, 39, 1), m});
  with("sliced [::2, 1::2] of (9, 75)", m, {sliced(sliced(contiguous({9, 75}), 0, 0, 9, 2), 1, 1, 75, 2), m});
  with("output sliced [:, 3:40] of (5, 43)", sliced(contiguous({5, 43}), 1, 3, 40, 1), {m, transposed(contiguous({37, 5}), 0, 1)});
  with("output step 3 [:, ::3] of (5, 111)", sliced(contiguous({5, 111}), 1, 0, 111, 3), {m});
  const std::vector<int64_t> s4 = {2, 6, 3, 5};
  with("NHWC out, NCHW in", channels_last(s4), {contiguous(s4), channels_last(s4)});
  with("NCHW out, NHWC in", contiguous(s4), {channels_last(s4), contiguous(s4)});
  with("NHWC out and in (memory order: dense)", channels_last(s4), {channels_last(s4)});
  with("NHWC out, per-channel bias (6, 1, 1)", channels_last(s4), {channels_last(s4), contiguous({6, 1, 1})});
  with("NHWC (2, 1, 3, 5) out (C = 1), NCHW in", channels_last({2, 1, 3, 5}), {contiguous({2, 1, 3, 5})});
  with("NHWC (2, 67, 4, 3) out, NCHW in", channels_last({2, 67, 4, 3}), {contiguous({2, 67, 4, 3}), channels_last({2, 67, 4, 3})});
  with("0-size (3, 0, 4)", contiguous({3, 0, 4}), {contiguous({3, 0, 4}), contiguous({4})});
  with("0-size (0) broadcast", contiguous({0}), {contiguous({0}), contiguous({})});
  with("1 element (1, 1, 1)", contiguous({1, 1, 1}), {contiguous({1, 1, 1}), contiguous({1})});
  with("(1, 1) of transposed", contiguous({1, 1}), {transposed(contiguous({1, 1}), 0, 1)});
  with("3-D broadcast (4, 1, 9) x (1, 7, 9)", contiguous({4, 7, 9}), {contiguous({4, 1, 9}), contiguous({1, 7, 9}), contiguous({7, 1})});
  with("large strided (33, 130) transposed", contiguous({33, 130}), {transposed(contiguous({130, 33}), 0, 1), contiguous({130})});
  // In place on a sliced view (e.g. y[:, ::2].add_(x)): gaps keep their values.
  {
    const View o = sliced(contiguous({5, 74}), 1, 0, 74, 2);
    std::vector<View> in{o, contiguous({37})};
    in.resize(static_cast<size_t>(inputs), in.back());
    out.push_back({"in place sliced [:, ::2] of (5, 74)", o, in, 0, {}, true});
  }
  return out;
}

// ---------------------------------------------------------------- small grids (grid-stride loops)

template <typename F>
void small_grid_case(const char* name, F f, int64_t n) {
  // contiguous_kernel<4, float, F, float, float> and strided_kernel over a transposed input with a
  // grid of 3 CTAs of 32 threads: each thread walks the grid-stride loop many times.
  Storage a(DType::f32, n, "a", 0), b(DType::f32, n, "b", 0);
  fill_values(a, 11, false, false);
  fill_values(b, 12, false, false);
  Storage g(DType::f32, n, "out cuda", 0), s(DType::f32, n, "out scalar", 0);
  IterShape shape;
  shape.ndim = 1;
  shape.sizes[0] = n;
  Operand ops[3];
  ops[0] = operand_of(contiguous({n}), s, {n});
  ops[1] = operand_of(contiguous({n}), a, {n});
  ops[2] = operand_of(contiguous({n}), b, {n});
  cpu::elementwise_loop<float, float, float>(shape, ops, f);
  const std::vector<char> all(static_cast<size_t>(n), 1);
  ::emu::launch(::emu::Config(dim3(3), dim3(32)), "contiguous_kernel (3 x 32)",
                [](auto&... args) { cuda_detail::contiguous_kernel<4, float, F, float, float>(args...); }, n, f,
                reinterpret_cast<float*>(g.at(0)), reinterpret_cast<const float*>(a.at(0)),
                reinterpret_cast<const float*>(b.at(0)));
  compare_storage(std::string(name) + " dense n=" + std::to_string(n), "contiguous_kernel grid 3 x 32 vs scalar", g, s,
                  all, nullptr, Tol::exact);
  // Strided: (rows, 37) with a transposed first input.
  const int64_t rows = n / 37;
  Storage g2(DType::f32, rows * 37, "out cuda", 0), s2(DType::f32, rows * 37, "out scalar", 0);
  IterShape shape2;
  shape2.ndim = 2;
  shape2.sizes[0] = rows;
  shape2.sizes[1] = 37;
  Operand ops2[3];
  const std::vector<int64_t> out_shape = {rows, 37};
  ops2[0] = operand_of(contiguous(out_shape), s2, out_shape);
  ops2[1] = operand_of(transposed(contiguous({37, rows}), 0, 1), a, out_shape);
  ops2[2] = operand_of(contiguous({37}), b, out_shape);
  cpu::elementwise_loop<float, float, float>(shape2, ops2, f);
  cuda_detail::OperandArray array{};
  for (int k = 0; k < 3; ++k) array.op[k] = ops2[k];
  array.op[0].data = g2.at(0);
  ::emu::launch(::emu::Config(dim3(3), dim3(32)), "strided_kernel (3 x 32)",
                [](auto&... args) { cuda_detail::strided_kernel<float, F, float, float>(args...); }, rows * 37, shape2,
                array, f);
  compare_storage(std::string(name) + " strided (" + std::to_string(rows) + ", 37)", "strided_kernel grid 3 x 32 vs scalar",
                  g2, s2, std::vector<char>(static_cast<size_t>(rows * 37), 1), nullptr, Tol::exact);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const auto start = std::chrono::steady_clock::now();
  const DType all_types[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8};
  const Op unary_ops[] = {
      {"relu", Kind::unary, UnaryOp::relu},
      {"gelu", Kind::unary, UnaryOp::gelu},
      {"exp", Kind::unary, UnaryOp::exp},
      {"tanh", Kind::unary, UnaryOp::tanh},
      {"affine", Kind::unary, UnaryOp::affine, BinaryOp::add, 1.5, -0.25},
      {"clamp", Kind::unary, UnaryOp::clamp, BinaryOp::add, -0.5, 0.75},
      {"isfinite", Kind::unary, UnaryOp::isfinite},
      {"gt_scalar", Kind::unary, UnaryOp::gt_scalar, BinaryOp::add, 0.5},
  };
  const Op binary_ops[] = {
      {"add", Kind::binary, UnaryOp::neg, BinaryOp::add, 1},
      {"add alpha", Kind::binary, UnaryOp::neg, BinaryOp::add, -0.5},
      {"mul", Kind::binary, UnaryOp::neg, BinaryOp::mul},
      {"div", Kind::binary, UnaryOp::neg, BinaryOp::div},
      {"maximum", Kind::binary, UnaryOp::neg, BinaryOp::maximum},
      {"lt", Kind::binary, UnaryOp::neg, BinaryOp::lt},
      {"eq", Kind::binary, UnaryOp::neg, BinaryOp::eq},
      {"gelu_backward", Kind::binary, UnaryOp::neg, BinaryOp::gelu_backward},
      {"relu_backward", Kind::binary, UnaryOp::neg, BinaryOp::relu_backward},
  };
  const Op where_op{"where", Kind::where};
  const Op copy_op{"copy", Kind::copy};

  // Every op and dtype on the strided layouts and the plain dense lengths.
  for (DType t : all_types) {
    for (const Op& op : unary_ops) {
      if (!applies(op, t)) continue;
      for (const Layout& l : strided_layouts(1)) {
        if (l.in_place && out_dtype(op, t) != t) continue;
        run(op, l, t);
      }
      for (const Layout& l : dense_layouts(1, dtype_size(t), false)) {
        if (l.in_place && out_dtype(op, t) != t) continue;
        run(op, l, t);
      }
    }
    for (const Op& op : binary_ops) {
      if (!applies(op, t)) continue;
      for (const Layout& l : strided_layouts(2)) {
        if (l.in_place && out_dtype(op, t) != t) continue;
        run(op, l, t);
      }
      for (const Layout& l : dense_layouts(2, dtype_size(t), false)) {
        if (l.in_place && out_dtype(op, t) != t) continue;
        run(op, l, t);
      }
    }
    for (const Layout& l : strided_layouts(3)) {
      if (l.in_place) continue;  // input 0 is the bool condition
      run(where_op, l, t);
    }
  }
  // Every alignment offset and tail on the vector path: one op per arity and kind, each dtype.
  for (DType t : all_types) {
    const Op& u = t == DType::b8 ? unary_ops[7] : is_floating(t) ? unary_ops[1] : unary_ops[0];  // gt / gelu / relu
    const Op& b = t == DType::b8 ? binary_ops[5] : binary_ops[1];                                // lt / add alpha
    for (const Layout& l : dense_layouts(1, dtype_size(t), true)) {
      if (l.in_place && out_dtype(u, t) != t) continue;
      if (l.name.find("+") != std::string::npos) run(u, l, t);
    }
    for (const Layout& l : dense_layouts(2, dtype_size(t), true)) {
      if (l.in_place && out_dtype(b, t) != t) continue;
      if (l.name.find("+") != std::string::npos) run(b, l, t);
      // A bool output's Pack is 16 / sizeof(T) bytes: moved by sizeof(T) it can stay on the vector path.
      if (is_floating(t) && !l.in_place && l.name.find("+") != std::string::npos) run(binary_ops[5], l, t);
    }
    // where: the bool condition's offsets too (its Pack is 16 / sizeof(T) bytes).
    for (const Layout& l : dense_layouts(3, dtype_size(t), true)) {
      if (l.in_place) continue;
      if (l.name.find("+") != std::string::npos || l.name.find("n=1023") != std::string::npos) run(where_op, l, t);
    }
  }
  // Casts (copy_cuda): every pair, dense (vector path, aligned or one element off) and strided;
  // same-dtype strided copies move raw words.
  for (DType from : all_types) {
    for (DType to : all_types) {
      std::vector<Layout> layouts = {
          {"dense n=1023", contiguous({1023}), {contiguous({1023})}, 0, {}},
          {"dense n=9, src +1 element", contiguous({9}), {contiguous({9})}, 0, {dtype_size(from)}},
          {"dense n=4097, dst +1 element", contiguous({4097}), {contiguous({4097})}, dtype_size(to), {}},
          // Packs narrower than 16 bytes (the narrower type of a cast): vector path at +8 bytes.
          {"dense n=1023, src +8 bytes", contiguous({1023}), {contiguous({1023})}, 0, {8}},
          {"dense n=1023, dst +8 bytes", contiguous({1023}), {contiguous({1023})}, 8, {}},
          {"transposed (37, 5)^T", contiguous({5, 37}), {transposed(contiguous({37, 5}), 0, 1)}, 0, {}},
          {"NCHW -> NHWC (2, 6, 3, 5)", channels_last({2, 6, 3, 5}), {contiguous({2, 6, 3, 5})}, 0, {}},
          {"NHWC -> NCHW (2, 6, 3, 5)", contiguous({2, 6, 3, 5}), {channels_last({2, 6, 3, 5})}, 0, {}},
          // Source strides of 64 bytes or more along the destination's rows (transpose_split):
          // same-dtype copies take copy.cu's shared-memory tiles (partial tiles at every edge),
          // the CPU its register-transposed tiles.
          {"transposed (67, 65)^T", contiguous({65, 67}), {transposed(contiguous({67, 65}), 0, 1)}, 0, {}},
          {"NCHW -> NHWC (2, 70, 9, 8)", channels_last({2, 70, 9, 8}), {contiguous({2, 70, 9, 8})}, 0, {}},
          {"NHWC -> NCHW (2, 70, 9, 8)", contiguous({2, 70, 9, 8}), {channels_last({2, 70, 9, 8})}, 0, {}},
          {"broadcast row (37) -> (5, 37)", contiguous({5, 37}), {contiguous({37})}, 0, {}},
          {"sliced [:, 1:38] of (5, 40) -> output [:, ::2]", sliced(contiguous({5, 74}), 1, 0, 74, 2),
           {sliced(contiguous({5, 40}), 1, 1, 38, 1)}, 0, {}},
          // Rows of contiguous elements at other row strides: same-dtype copies take one
          // cudaMemcpy2DAsync (copy.cu), casts the elementwise kernel.
          {"column slice: (5, 37) -> output [:, 2:39] of (5, 41)", sliced(contiguous({5, 41}), 1, 2, 39, 1),
           {contiguous({5, 37})}, 0, {}},
          {"sliced [:, 1:38] of (5, 40) -> (5, 37)", contiguous({5, 37}), {sliced(contiguous({5, 40}), 1, 1, 38, 1)},
           0, {}},
      };
      for (const Layout& l : layouts) run(copy_op, l, from, to);
    }
  }
  // A double too small for float: true as a bool (torch), whatever float would make of it. CUDA's
  // failure counts; the CPU's (copy.cpp converts through float: false) is printed as a note.
  {
    Storage src(DType::f64, 3, "tiny doubles", 0), g(DType::b8, 3, "out cuda", 0), c(DType::b8, 3, "out cpu", 0);
    put(DType::f64, src.at(0), 1e-50);
    put(DType::f64, src.at(1), -1e-300);
    put(DType::f64, src.at(2), 0.0);
    IterShape shape;
    shape.ndim = 2;
    shape.sizes[0] = 3;
    shape.sizes[1] = 1;
    Operand o[2];
    o[0] = operand_of(contiguous({3, 1}), g, {3, 1});
    o[1] = operand_of(contiguous({3, 1}), src, {3, 1});
    copy_cuda(shape, o[0], o[1], nullptr);
    o[0].data = c.at(0);
    copy_cpu(shape, o[0], o[1]);
    ++checks;
    const double want[3] = {1, 1, 0};
    bool cuda_ok = true;
    for (int i = 0; i < 3; ++i) {
      if (get(DType::b8, g.at(i)) != want[i]) cuda_ok = false;
      if (get(DType::b8, g.at(i)) != want[i] || get(DType::b8, c.at(i)) != want[i]) {
        std::printf("%s copy f64 -> bool of %g: cuda %g, cpu %g, want %g\n", cuda_ok ? "NOTE (cpu)" : "FAIL",
                    get(DType::f64, src.at(i)), get(DType::b8, g.at(i)), get(DType::b8, c.at(i)), want[i]);
      }
    }
    if (!cuda_ok) ++failures;
  }
  // add of float32 and a 16-bit type into float32 (autocast's promote in one pass; elementwise.h):
  // strided layouts, dense lengths and offsets (4 bytes: every operand stays aligned to its type),
  // in place on the float32 input.
  const std::pair<DType, DType> mixed_pairs[] = {
      {DType::f32, DType::bf16}, {DType::f32, DType::f16}, {DType::bf16, DType::f32}, {DType::f16, DType::f32}};
  for (const auto& [first, second] : mixed_pairs) {
    for (const Op& op : {binary_ops[0], binary_ops[1]}) {  // add, add alpha
      for (const Layout& l : strided_layouts(2)) {
        if (l.in_place && first != DType::f32) continue;
        run(op, l, first, DType::f32, second);
      }
      for (const Layout& l : dense_layouts(2, 4, true)) {
        if (l.in_place && first != DType::f32) continue;
        run(op, l, first, DType::f32, second);
      }
    }
  }
  // Other mixed input dtypes: rejected by both (check_operands), nothing launched.
  {
    Storage a(DType::f32, 4, "a f32", 0), b(DType::f64, 4, "b f64", 0), g(DType::f32, 4, "out", 0);
    IterShape shape;
    shape.ndim = 1;
    shape.sizes[0] = 4;
    Operand o[3] = {operand_of(contiguous({4}), g, {4}), operand_of(contiguous({4}), a, {4}),
                    operand_of(contiguous({4}), b, {4})};
    int thrown = 0;
    const long before = emu::launches.load();
    try { binary_cuda(BinaryOp::add, shape, o[0], o[1], o[2], 1, 0, nullptr); } catch (const Error&) { ++thrown; }
    try { binary_cpu(BinaryOp::add, shape, o[0], o[1], o[2], 1, 0); } catch (const Error&) { ++thrown; }
    ++checks;
    if (thrown != 2 || emu::launches.load() != before || !all_ff(g.at(0), 16)) {
      ++failures;
      std::printf("FAIL add f32 + f64: %d of 2 threw, %ld launches, output %s\n", thrown, emu::launches.load() - before,
                  all_ff(g.at(0), 16) ? "untouched" : "written");
    }
  }
  // The grid-stride loops.
  small_grid_case("add alpha", math::Bound<math::Add, float>{-0.5f, 0.f}, 4097);
  small_grid_case("gelu_backward", math::Bound<math::GeluBackward, float>{0.f, 0.f}, 1203);

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%ld cases (%ld on the vector path), %.0f s\n", cases_run, vector_path_cases, seconds);
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
