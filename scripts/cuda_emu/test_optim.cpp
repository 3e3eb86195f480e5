// optim.cu (with multi_tensor_apply.cuh) emulated against kernels/cpu/optim.cpp
// (linked by run_kernels.sh), through the public entry points of kernels/optim.h:
// the *_cuda function and the *_cpu function get the same initial bytes (device
// buffers between guard pages, host vectors) and every buffer is compared after.
//   optimizers  sgd (momentum/dampening/nesterov/weight decay/maximize, and none),
//               adam (Adam L2, AdamW + amsgrad, maximize + amsgrad), lamb (with and
//               without weight decay / bias correction), lars (with and without
//               momentum), for f32, f64, f16 and bf16 params, 16-bit ones with an
//               fp32 master and without (bf16-true: 16-bit state). The long list:
//               141 tensors (more than one OptimMeta holds, 128: two launches) with
//               sizes 0, 1, 3, 4095, 4097, kOptimChunk - 1, kOptimChunk,
//               kOptimChunk + 1 (the last slot of the first launch), 2 kOptimChunk + 1
//               (in the second launch) and odd small ones; sgd/adam run every param
//               kind on it, lamb/lars (block reductions: slow to emulate) one kind per
//               variant and the others on an 11-tensor list of the same size classes.
//               One tensor has a zero param and one a zero grad (LAMB/LARS's ratio-1 /
//               no-adapt paths); first steps and later ones. found_inf null, 0 and set
//               (everything must stay as it was: params, masters, states, step
//               counters, grads, partials), grad_scale null or 0.75.
//   prologue    optim_step_prologue with 0, 1, 999, 1000, 1001, 2345 counters
//               (kMaxStepPointers = 1000 per launch), global step null or not,
//               found_inf null/0/set.
//   scaler      unscale over 520 grads (ListMeta holds 512: two launches; scale
//               65536, 3 with a NaN in the second launch, 1 with an inf in the first)
//               and, for each dtype, over 5 (scale 3, 1 with found_inf starting at 1,
//               1024 with an inf, 65536 with a NaN); scaler_update over 12-step
//               sequences (1, 3, 16 flags, intervals 1, 2, 3, 1000, growth
//               overflowing to inf: the scale kept).
//   clipping    norm partials over the 520 grads for p = 2 (with a NaN in the
//               second launch), inf and 3, and over 5 grads for p = 2, 1, inf, 3,
//               0.5, each dtype, with an inf, with a NaN; norm finish (total and a
//               clip coefficient below 1, of 1, or none) on those partials and on
//               0, 1, 3, 1500 synthetic ones; grad_scale (0.37, and 1: nothing
//               written, checked on signalling-NaN bits) and grad_clamp with
//               +-inf/NaN, over the 520 grads and 5 of each dtype.
//   averaging   average_update over 390 pairs (PairMeta holds 384), lerp with
//               weights 0.1 and 0.75, SWA divisors 3 and 1, skip flag null/0/set.
//   schedules   schedule_step over programs of every ScheduleKind (a three-segment
//               linear warmup -> cosine -> exponential, one_cycle/cyclic with
//               momentum, swa with a base_lr override), 3 groups (a null momentum /
//               base_lr among them), 30 steps with found_inf set on some and
//               advance false on some.
// What must match: per-element updates (optim_math.h, the same code in the same
// order on both sides) bit for bit; NaN matches any NaN (a 16-bit NaN's payload
// is the converter's choice). The CPU object is built with -ffp-contract=off
// (run_kernels.sh): the emulated .cu is compiled for baseline x86-64, without
// FMA, so a CPU object contracting a*b+c into an FMA would differ in the last
// bit for reasons that are the compiler's, not the kernel's. (On a real GPU
// nvcc contracts by default, so there the two devices differ in the last bits.)
// Reductions are summed in another order (a block tree of 512 threads against a
// sequential loop per chunk): partials of sums of non-negative terms (norms,
// LAMB/LARS squared norms) match within 2 n u |want| (n = kOptimChunk terms,
// u = 2^-53: any order's error is at most (n - 1) u times the sum), max-norm
// partials bit for bit; what the trust ratios feed (LAMB/LARS params and
// masters, LARS momentum buffers) within r |update| + 1 ulp of the stored type,
// r = 1e-10 (the ratio's double error) + 2^-23 with a float compute type (the
// float step may round the other way); norm totals and clip coefficients
// within 2 float ulps. Outputs that are only written (partials, total norm,
// clip coefficient) start as NaN, so a missing write shows; in-place buffers
// start from data every update changes. Each case prints its element counts
// and launches.
//   bash scripts/cuda_emu/run_kernels.sh optim [optimizers|prologue|scaler|clip|average|schedule]
#include "emu_test.h"
#include "emu_optim.inc"

#include <array>
#include <chrono>
#include <functional>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

// ---------------------------------------------------------------- buffers

enum class Elem { f32, f64, f16, bf16, i64, i32 };

size_t size_of(Elem e) {
  switch (e) {
    case Elem::f64:
    case Elem::i64: return 8;
    case Elem::f32:
    case Elem::i32: return 4;
    default: return 2;
  }
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::f32: return "f32";
    case Elem::f64: return "f64";
    case Elem::f16: return "f16";
    case Elem::bf16: return "bf16";
    case Elem::i64: return "i64";
    default: return "i32";
  }
}

template <typename T>
Elem elem_of() {
  if constexpr (std::is_same_v<T, Half>) return Elem::f16;
  if constexpr (std::is_same_v<T, BFloat16>) return Elem::bf16;
  if constexpr (std::is_same_v<T, float>) return Elem::f32;
  return Elem::f64;
}

DType dtype_of(Elem e) {
  switch (e) {
    case Elem::f32: return DType::f32;
    case Elem::f64: return DType::f64;
    case Elem::f16: return DType::f16;
    default: return DType::bf16;
  }
}

bool is_float(Elem e) { return e != Elem::i64 && e != Elem::i32; }

double get(Elem e, const void* base, int64_t i) {
  const auto* p = static_cast<const unsigned char*>(base) + i * static_cast<int64_t>(size_of(e));
  switch (e) {
    case Elem::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case Elem::f64: { double v; std::memcpy(&v, p, 8); return v; }
    case Elem::f16: { uint16_t b; std::memcpy(&b, p, 2); return Half::to_float(b); }
    case Elem::bf16: { uint16_t b; std::memcpy(&b, p, 2); return bits_float(static_cast<uint32_t>(b) << 16); }
    case Elem::i64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    default: { int32_t v; std::memcpy(&v, p, 4); return v; }
  }
}

void put(Elem e, void* base, int64_t i, double value) {
  auto* p = static_cast<unsigned char*>(base) + i * static_cast<int64_t>(size_of(e));
  switch (e) {
    case Elem::f32: { const float v = static_cast<float>(value); std::memcpy(p, &v, 4); break; }
    case Elem::f64: std::memcpy(p, &value, 8); break;
    case Elem::f16: { const uint16_t b = Half::from_float(static_cast<float>(value)); std::memcpy(p, &b, 2); break; }
    case Elem::bf16: { const uint16_t b = BFloat16::from_float(static_cast<float>(value)); std::memcpy(p, &b, 2); break; }
    case Elem::i64: { const auto v = static_cast<int64_t>(value); std::memcpy(p, &v, 8); break; }
    default: { const auto v = static_cast<int32_t>(value); std::memcpy(p, &v, 4); break; }
  }
}

// The gap above |v| in e (one unit in the last place).
double ulp(Elem e, double v) {
  v = std::abs(v);
  switch (e) {
    case Elem::f32: { const float f = static_cast<float>(v); return static_cast<double>(std::nextafter(f, INFINITY)) - f; }
    case Elem::f64: return std::nextafter(v, INFINITY) - v;
    case Elem::f16: {
      const uint16_t b = Half::from_float(static_cast<float>(v));
      return static_cast<double>(Half::to_float(static_cast<uint16_t>(b + 1))) - Half::to_float(b);
    }
    case Elem::bf16: {
      const uint16_t b = BFloat16::from_float(static_cast<float>(v));
      return static_cast<double>(bits_float((b + 1u) << 16)) - bits_float(static_cast<uint32_t>(b) << 16);
    }
    default: return 0;
  }
}

// One buffer on both sides: the emulated device's (between guard pages) and the
// CPU's, from the same initial bytes (kept in `initial`).
struct Twin {
  Elem elem;
  int64_t n;
  std::string name;
  emu::Buffer<unsigned char> dev;
  std::vector<unsigned char> host, initial;
  // misalign: bytes the device buffer starts past a 16-byte boundary (a view
  // at an odd offset: the kernels' vector paths must step aside for it).
  Twin(Elem e, int64_t count, const std::string& label, const std::function<double(int64_t)>& value,
       size_t misalign = 0)
      : elem(e), n(count), name(label), dev(static_cast<size_t>(count) * size_of(e), label, misalign),
        host(static_cast<size_t>(count) * size_of(e)) {
    for (int64_t i = 0; i < n; ++i) put(elem, host.data(), i, value(i));
    initial = host;
    if (!host.empty()) std::memcpy(dev.data, host.data(), host.size());
  }
  void* d() { return dev.data; }
  void* h() { return host.data(); }
  template <typename U>
  U* dp() { return reinterpret_cast<U*>(dev.data); }
  template <typename U>
  U* hp() { return reinterpret_cast<U*>(host.data()); }
};
using TwinPtr = std::unique_ptr<Twin>;

TwinPtr twin(Elem e, int64_t n, const std::string& name, const std::function<double(int64_t)>& value,
             size_t misalign = 0) {
  return std::make_unique<Twin>(e, n, name, value, misalign);
}
TwinPtr scalar(Elem e, double value, const std::string& name) {
  return twin(e, 1, name, [=](int64_t) { return value; });
}
TwinPtr poisoned(Elem e, int64_t n, const std::string& name) {
  return twin(e, n, name, [](int64_t) { return NAN; });
}

// ---------------------------------------------------------------- comparisons

// got vs want, elementwise: `bits` (the same bytes), `nan_equal` (the same
// bytes, or both NaN), or within allowed(want, old) (old: the initial value).
enum class Mode { bits, nan_equal, tolerance };
using Allowed = std::function<double(double want, double old)>;

struct Tally {
  long bad = 0, inexact = 0, total = 0;
  std::string first;
};

void tally(Tally& t, Twin& x, const void* got, const void* want, Mode mode, const Allowed& allowed = nullptr) {
  const size_t size = size_of(x.elem);
  for (int64_t i = 0; i < x.n; ++i) {
    ++t.total;
    const auto* g = static_cast<const unsigned char*>(got) + i * static_cast<int64_t>(size);
    const auto* w = static_cast<const unsigned char*>(want) + i * static_cast<int64_t>(size);
    if (std::memcmp(g, w, size) == 0) continue;
    const double gv = get(x.elem, got, i), wv = get(x.elem, want, i);
    bool ok = false;
    if (mode != Mode::bits && is_float(x.elem)) {
      if (std::isnan(gv) && std::isnan(wv)) {
        ok = true;
      } else if (mode == Mode::tolerance && std::isfinite(wv)) {
        ++t.inexact;
        ok = std::abs(gv - wv) <= allowed(wv, get(x.elem, x.initial.data(), i));
      }
    }
    if (!ok && t.bad++ == 0) {
      char text[256];
      std::snprintf(text, sizeof text, "%s[%ld] %.17g vs %.17g (was %.17g)", x.name.c_str(), static_cast<long>(i), gv,
                    wv, get(x.elem, x.initial.data(), i));
      t.first = text;
    }
  }
}

bool case_ok = true;  // the current case's checks all passed

// One check: prints a FAIL line (the first bad element) when any differs.
void report(const std::string& label, const char* what, const Tally& t) {
  ++checks;
  if (t.bad == 0) return;
  ++failures;
  case_ok = false;
  std::printf("FAIL %s: %s: %ld of %ld differ; first %s\n", label.c_str(), what, t.bad, t.total, t.first.c_str());
  if (std::getenv("EMU_STOP")) std::exit(1);
}

// dev vs host over the twins.
void check(const std::string& label, const char* what, const std::vector<Twin*>& twins, Mode mode,
           const Allowed& allowed = nullptr, long* inexact = nullptr) {
  Tally t;
  for (Twin* x : twins) tally(t, *x, x->d(), x->h(), mode, allowed);
  if (inexact != nullptr) *inexact += t.inexact;
  report(label, what, t);
}

// The device side as it started (and, as the CPU must have left it too, the host side).
void check_untouched(const std::string& label, const char* what, const std::vector<Twin*>& twins) {
  Tally t;
  for (Twin* x : twins) {
    tally(t, *x, x->d(), x->initial.data(), Mode::bits);
    tally(t, *x, x->h(), x->initial.data(), Mode::bits);
  }
  report(label, what, t);
}

// The CUDA side's entry point, with a kiln::Error (an invalid launch) counted as a failure.
template <typename Fn>
void run_cuda(const std::string& label, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    ++checks;
    ++failures;
    case_ok = false;
    std::printf("FAIL %s: threw %s\n", label.c_str(), e.what());
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

struct CaseTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  long launches = emu::launches.load(), ctas = emu::ctas.load();
  void done(const std::string& label, const std::string& extra = "") {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s %s  %s(%ld launches, %ld CTAs, %.2f s)\n", case_ok ? "done" : "FAILED", label.c_str(),
                extra.c_str(), emu::launches.load() - launches, emu::ctas.load() - ctas, seconds);
    std::fflush(stdout);
    case_ok = true;
  }
};

int64_t total_chunks(const std::vector<int64_t>& sizes) {
  int64_t chunks = 0;
  for (int64_t n : sizes) chunks += optim_chunks(n);
  return chunks;
}

int64_t total_elements(const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  return total;
}

// `count` tensors: odd small sizes, with `big` placed at the given positions.
std::vector<int64_t> list_sizes(int count, const std::vector<std::pair<int, int64_t>>& big) {
  std::vector<int64_t> sizes(static_cast<size_t>(count));
  for (int t = 0; t < count; ++t) sizes[t] = 1 + (t * 37) % 97;
  for (const auto& [at, n] : big) sizes[at] = n;
  return sizes;
}

// Partials of sums of non-negative terms: each summation order is within (n - 1) u of the sum.
const Allowed kSumPartials = [](double want, double) { return 2.0 * kOptimChunk * std::ldexp(1.0, -53) * std::abs(want); };

enum class Found { null, clear, set };
const char* found_name(Found f) { return f == Found::null ? "found:null" : f == Found::clear ? "found:0" : "found:set"; }

// ---------------------------------------------------------------- optimizers

enum class Opt { sgd, adam, lamb, lars };

struct OptimVariant {
  Opt opt;
  const char* name;
  double lr, momentum;
  SgdConfig sgd{};
  AdamConfig adam{};
  LambConfig lamb{};
  LarsConfig lars{};
};

std::vector<OptimVariant> optim_variants() {
  std::vector<OptimVariant> v;
  {
    OptimVariant x{Opt::sgd, "sgd momentum nesterov wd", 0.1, 0.9};
    x.sgd = {.dampening = 0.0, .weight_decay = 1e-2, .nesterov = true, .maximize = false, .has_momentum = true};
    v.push_back(x);
    x = {Opt::sgd, "sgd momentum dampening maximize", 0.1, 0.8};
    x.sgd = {.dampening = 0.1, .weight_decay = 0.0, .nesterov = false, .maximize = true, .has_momentum = true};
    v.push_back(x);
    x = {Opt::sgd, "sgd plain wd", 0.05, 0.0};
    x.sgd = {.dampening = 0.0, .weight_decay = 5e-4, .nesterov = false, .maximize = false, .has_momentum = false};
    v.push_back(x);
  }
  {
    OptimVariant x{Opt::adam, "adam l2", 1e-2, 0.9};
    x.adam = {.beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2, .decoupled_weight_decay = false, .amsgrad = false,
              .maximize = false};
    v.push_back(x);
    x = {Opt::adam, "adamw amsgrad", 1e-2, 0.85};
    x.adam = {.beta2 = 0.98, .eps = 1e-6, .weight_decay = 0.05, .decoupled_weight_decay = true, .amsgrad = true,
              .maximize = false};
    v.push_back(x);
    x = {Opt::adam, "adam maximize amsgrad", 3e-3, 0.9};
    x.adam = {.beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0, .decoupled_weight_decay = false, .amsgrad = true,
              .maximize = true};
    v.push_back(x);
  }
  {
    OptimVariant x{Opt::lamb, "lamb wd", 1e-2, 0.9};
    x.lamb = {.beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.01, .bias_correction = true};
    v.push_back(x);
    x = {Opt::lamb, "lamb no-bias-correction", 2e-2, 0.8};
    x.lamb = {.beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.0, .bias_correction = false};
    v.push_back(x);
  }
  {
    OptimVariant x{Opt::lars, "lars momentum wd", 0.1, 0.9};
    x.lars = {.weight_decay = 1e-4, .trust_coefficient = 0.001, .eps = 1e-8, .has_momentum = true};
    v.push_back(x);
    x = {Opt::lars, "lars plain", 0.2, 0.0};
    x.lars = {.weight_decay = 0.0, .trust_coefficient = 0.02, .eps = 1e-8, .has_momentum = false};
    v.push_back(x);
  }
  return v;
}

int state_count(const OptimVariant& v) {
  switch (v.opt) {
    case Opt::sgd: return v.sgd.has_momentum ? 1 : 0;
    case Opt::adam: return v.adam.amsgrad ? 3 : 2;
    case Opt::lamb: return 2;
    default: return v.lars.has_momentum ? 1 : 0;
  }
}

// The list of the optimizer cases (141 tensors: two OptimMeta launches).
std::vector<int64_t> optim_list() {
  return list_sizes(141, {{0, 1},
                          {1, 3},
                          {2, 0},
                          {3, 4095},
                          {4, 4097},
                          {9, kOptimChunk},
                          {40, kOptimChunk - 1},
                          {127, kOptimChunk + 1},
                          {133, 2 * kOptimChunk + 1}});
}
constexpr int kZeroParam = 5, kZeroGrad = 6;  // LAMB/LARS: a zero norm (ratio 1 / no adaptation)

template <typename T>
void optim_case(const OptimVariant& v, bool master, const std::vector<int64_t>& sizes, Found found, bool scaled) {
  CaseTimer timer;
  const Elem pe = elem_of<T>();
  const bool narrow = sizeof(T) == 2 && !master;
  const Elem ce = std::is_same_v<T, double> ? Elem::f64 : Elem::f32;  // compute type
  const Elem se = narrow ? pe : ce;                                     // state type
  const int count = static_cast<int>(sizes.size());
  const int states = state_count(v);
  char label_text[200];
  std::snprintf(label_text, sizeof label_text, "%-31s %-4s %-6s n %3d %-9s %s", v.name, elem_name(pe),
                master ? "master" : (narrow ? "narrow" : ""), count, found_name(found), scaled ? "scale" : "");
  const std::string label = label_text;

  std::vector<TwinPtr> owned;
  std::vector<Twin*> params, grads, masters, state[3];
  std::vector<OptimTensor> dev(count), host(count);
  TwinPtr steps = twin(Elem::i64, count, "steps", [](int64_t t) { return t % 4 == 0 ? 1 : 2 + t % 7; });
  for (int t = 0; t < count; ++t) {
    const int64_t n = sizes[t];
    std::mt19937_64 engine(static_cast<uint64_t>(t * 7919 + n * 31 + static_cast<int>(v.opt)));
    std::normal_distribution<double> normal;
    std::vector<double> p(n), m(n), g(n), s0(n), s1(n), s2(n);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = static_cast<float>(normal(engine));
      p[i] = t == kZeroParam ? 0.0 : m[i];
      g[i] = t == kZeroGrad ? 0.0 : 0.5 * normal(engine);
      s0[i] = 0.1 * normal(engine);
      s1[i] = 0.01 * std::abs(normal(engine));
      s2[i] = i % 2 == 0 ? s1[i] + 0.005 * std::abs(normal(engine)) : 0.5 * s1[i];  // max picks either
    }
    const std::string name = "t" + std::to_string(t);
    // Every fifth param one element off a 16-byte boundary: its chunks take
    // the scalar loop where the others take adam's float4 one.
    owned.push_back(twin(pe, n, name + ".param", [&](int64_t i) { return p[i]; }, t % 5 == 2 ? size_of(pe) : 0));
    params.push_back(owned.back().get());
    owned.push_back(twin(pe, n, name + ".grad", [&](int64_t i) { return g[i]; }));
    grads.push_back(owned.back().get());
    dev[t].param = params.back()->d();
    host[t].param = params.back()->h();
    dev[t].grad = grads.back()->d();
    host[t].grad = grads.back()->h();
    if (master) {
      owned.push_back(twin(Elem::f32, n, name + ".master", [&](int64_t i) { return t == kZeroParam ? 0.0 : m[i]; }));
      masters.push_back(owned.back().get());
      dev[t].master = masters.back()->dp<float>();
      host[t].master = masters.back()->hp<float>();
    }
    const std::vector<double>* init[3] = {&s0, &s1, &s2};
    for (int k = 0; k < states; ++k) {
      const std::vector<double>& values = *init[k];
      owned.push_back(twin(se, n, name + ".state" + std::to_string(k), [&](int64_t i) { return values[i]; }));
      state[k].push_back(owned.back().get());
      dev[t].state[k] = state[k].back()->d();
      host[t].state[k] = state[k].back()->h();
    }
    dev[t].step = steps->dp<int64_t>() + t;
    host[t].step = steps->hp<int64_t>() + t;
    dev[t].numel = host[t].numel = n;
  }
  TwinPtr lr = scalar(Elem::f64, v.lr, "lr"), momentum = scalar(Elem::f64, v.momentum, "momentum");
  TwinPtr found_inf = scalar(Elem::f32, found == Found::set ? 1.0 : 0.0, "found_inf");
  TwinPtr grad_scale = scalar(Elem::f32, 0.75, "grad_scale");
  const int64_t chunks = total_chunks(sizes);
  TwinPtr partials = poisoned(Elem::f64, 2 * chunks, "partials");
  OptimScalars dev_scalars{lr->dp<double>(), momentum->dp<double>(),
                           found == Found::null ? nullptr : found_inf->dp<float>(),
                           scaled ? grad_scale->dp<float>() : nullptr};
  OptimScalars host_scalars{lr->hp<double>(), momentum->hp<double>(),
                            found == Found::null ? nullptr : found_inf->hp<float>(),
                            scaled ? grad_scale->hp<float>() : nullptr};
  const DType dtype = dtype_of(pe);
  switch (v.opt) {
    case Opt::sgd:
      sgd_step_cpu(dtype, host.data(), count, host_scalars, v.sgd);
      run_cuda(label, [&] { sgd_step_cuda(dtype, dev.data(), count, dev_scalars, v.sgd, nullptr); });
      break;
    case Opt::adam:
      adam_step_cpu(dtype, host.data(), count, host_scalars, v.adam);
      run_cuda(label, [&] { adam_step_cuda(dtype, dev.data(), count, dev_scalars, v.adam, nullptr); });
      break;
    case Opt::lamb:
      lamb_step_cpu(dtype, host.data(), count, host_scalars, v.lamb, partials->hp<double>());
      run_cuda(label, [&] { lamb_step_cuda(dtype, dev.data(), count, dev_scalars, v.lamb, partials->dp<double>(), nullptr); });
      break;
    case Opt::lars:
      lars_step_cpu(dtype, host.data(), count, host_scalars, v.lars, partials->hp<double>());
      run_cuda(label, [&] { lars_step_cuda(dtype, dev.data(), count, dev_scalars, v.lars, partials->dp<double>(), nullptr); });
      break;
  }

  long inexact = 0;
  check_untouched(label, "grads", grads);
  check_untouched(label, "steps", {steps.get()});
  if (found == Found::set) {
    check_untouched(label, "params (skipped step)", params);
    check_untouched(label, "masters (skipped step)", masters);
    for (int k = 0; k < states; ++k) check_untouched(label, "state (skipped step)", state[k]);
    check_untouched(label, "partials (skipped step)", {partials.get()});
  } else if (v.opt == Opt::sgd || v.opt == Opt::adam) {
    check(label, "params", params, Mode::bits);
    check(label, "masters", masters, Mode::bits);
    for (int k = 0; k < states; ++k) check(label, k == 0 ? "state0" : k == 1 ? "state1" : "state2", state[k], Mode::bits);
  } else {
    // What the trust ratio (a sum in another order) feeds: see the header.
    const double r = 1e-10 + (ce == Elem::f32 ? std::ldexp(1.0, -23) : 0.0);
    const auto update_within = [r](Elem e) {
      return [r, e](double want, double old) { return r * std::abs(want - old) + ulp(e, want); };
    };
    check(label, "params", params, Mode::tolerance, update_within(pe), &inexact);
    check(label, "masters", masters, Mode::tolerance, update_within(Elem::f32), &inexact);
    check(label, "partials", {partials.get()}, Mode::tolerance, kSumPartials);
    if (v.opt == Opt::lamb) {
      check(label, "exp_avg", state[0], Mode::bits);
      check(label, "exp_avg_sq", state[1], Mode::bits);
    } else if (states > 0) {
      check(label, "momentum buffer", state[0], Mode::tolerance,
            [r, se](double want, double old) { return r * (std::abs(want) + std::abs(old)) + ulp(se, want); },
            &inexact);
    }
  }
  char extra[120];
  std::snprintf(extra, sizeof extra, "%ld elements, %ld chunks%s ", static_cast<long>(total_elements(sizes)),
                static_cast<long>(chunks),
                inexact > 0 ? (", " + std::to_string(inexact) + " within tolerance, not bit-equal").c_str() : "");
  timer.done(label, extra);
}

void optim_all() {
  const std::vector<int64_t> long_list = optim_list();
  // LAMB/LARS's block reductions are slow to emulate (512 threads meeting at each barrier): one param
  // kind per variant takes the long list, the others this one (every size class, one launch).
  const std::vector<int64_t> medium = {1, 3, 0, 4095, 4097, kOptimChunk - 1, kOptimChunk, kOptimChunk + 1,
                                       2 * kOptimChunk + 1, 5, 77};
  const std::vector<int64_t> small = {1, 3, kOptimChunk + 1, 7};
  int k = 0;
  for (const OptimVariant& v : optim_variants()) {
    // found_inf and grad_scale rotate over the variants.
    const Found found = k % 2 == 0 ? Found::null : Found::clear;
    const bool scaled = k % 3 != 1;
    const bool reduces = v.opt == Opt::lamb || v.opt == Opt::lars;
    const std::vector<int64_t>& others = reduces ? medium : long_list;
    optim_case<float>(v, false, reduces && k % 2 == 1 ? medium : long_list, found, scaled);
    optim_case<double>(v, false, others, found, !scaled);
    optim_case<Half>(v, true, others, found, scaled);
    optim_case<Half>(v, false, others, found, !scaled);
    optim_case<BFloat16>(v, true, others, found, scaled);
    optim_case<BFloat16>(v, false, reduces && k % 2 == 0 ? medium : long_list, found, scaled);
    ++k;
    // A skipped step: nothing may change (the long list for f32 and bf16-true: both launches).
    optim_case<float>(v, false, long_list, Found::set, scaled);
    optim_case<BFloat16>(v, false, long_list, Found::set, scaled);
    optim_case<double>(v, false, small, Found::set, !scaled);
    optim_case<Half>(v, true, small, Found::set, scaled);
  }
}

// ---------------------------------------------------------------- step prologue

void prologue_case(int64_t count, bool global, Found found) {
  CaseTimer timer;
  char label[120];
  std::snprintf(label, sizeof label, "prologue n %4ld %-8s %s", static_cast<long>(count), global ? "global" : "",
                found_name(found));
  auto steps = twin(Elem::i64, count, "param steps", [](int64_t i) { return i * 7 + 1; });
  auto global_step = scalar(Elem::i64, 41, "global step");
  auto found_inf = scalar(Elem::f32, found == Found::set ? 1.0 : 0.0, "found_inf");
  std::vector<int64_t*> dev(count), host(count);
  for (int64_t i = 0; i < count; ++i) {
    dev[i] = steps->dp<int64_t>() + i;
    host[i] = steps->hp<int64_t>() + i;
  }
  optim_step_prologue_cpu(global ? global_step->hp<int64_t>() : nullptr, host.data(), count,
                          found == Found::null ? nullptr : found_inf->hp<float>());
  run_cuda(label, [&] {
    optim_step_prologue_cuda(global ? global_step->dp<int64_t>() : nullptr, dev.data(), count,
                             found == Found::null ? nullptr : found_inf->dp<float>(), nullptr);
  });
  check(label, "param steps", {steps.get()}, Mode::bits);
  check(label, "global step", {global_step.get()}, Mode::bits);
  if (found == Found::set) check_untouched(label, "steps (skipped)", {steps.get(), global_step.get()});
  timer.done(label);
}

// ---------------------------------------------------------------- gradient lists

struct GradList {
  std::vector<TwinPtr> owned;
  std::vector<Twin*> twins;
  std::vector<ListTensor> dev, host;
};

// special(t, i, value): the value to store instead (inf/NaN placements).
GradList make_grads(Elem e, const std::vector<int64_t>& sizes, uint64_t seed, double sigma,
                    const std::function<double(int, int64_t, double)>& special = nullptr) {
  GradList list;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    std::mt19937_64 engine(seed * 1000003 + t);
    std::normal_distribution<double> normal;
    std::vector<double> values(n);
    for (int64_t i = 0; i < n; ++i) {
      values[i] = sigma * normal(engine);
      if (special) values[i] = special(static_cast<int>(t), i, values[i]);
    }
    list.owned.push_back(twin(e, n, "g" + std::to_string(t), [&](int64_t i) { return values[i]; }));
    list.twins.push_back(list.owned.back().get());
    list.dev.push_back({list.twins.back()->d(), n});
    list.host.push_back({list.twins.back()->h(), n});
  }
  return list;
}

// The list of the list-kernel cases (520 tensors: two ListMeta launches).
std::vector<int64_t> grad_list() {
  return list_sizes(520, {{0, 1}, {1, 0}, {2, 4097}, {3, 4095}, {100, kOptimChunk - 1}, {511, kOptimChunk + 1},
                          {515, 2 * kOptimChunk + 1}});
}

// where: 0 none, 1 an inf, 2 a NaN: in a long list (more than 512 tensors) in the first launch's
// tensor 100 / the second launch's tensor 515 (its third chunk), in a short one in tensor 2 / 4.
std::function<double(int, int64_t, double)> specials(int where, size_t count) {
  if (where == 0) return nullptr;
  const bool long_list = count > 512;
  return [where, long_list](int t, int64_t i, double v) {
    if (where == 1 && t == (long_list ? 100 : 2) && i == (long_list ? 12345 : kOptimChunk)) {
      return -static_cast<double>(INFINITY);
    }
    if (where == 2 && t == (long_list ? 515 : 4) && i == (long_list ? 2 * kOptimChunk : 4096)) {
      return static_cast<double>(NAN);
    }
    return v;
  };
}

void unscale_case(Elem e, const std::vector<int64_t>& sizes, float scale, float found_start, int where) {
  CaseTimer timer;
  char label[140];
  std::snprintf(label, sizeof label, "unscale %-4s n %3zu scale %-6g found_inf from %g %s", elem_name(e), sizes.size(),
                scale, found_start, where == 0 ? "" : where == 1 ? "inf" : "NaN");
  GradList g = make_grads(e, sizes, 11, 300.0, specials(where, sizes.size()));
  auto s = scalar(Elem::f32, scale, "scale");
  auto found = scalar(Elem::f32, found_start, "found_inf");
  grad_scaler_unscale_cpu(dtype_of(e), g.host.data(), static_cast<int64_t>(sizes.size()), s->hp<float>(), found->hp<float>());
  run_cuda(label, [&] {
    grad_scaler_unscale_cuda(dtype_of(e), g.dev.data(), static_cast<int64_t>(sizes.size()), s->dp<float>(),
                             found->dp<float>(), nullptr);
  });
  check(label, "grads", g.twins, Mode::nan_equal);
  check(label, "found_inf", {found.get()}, Mode::bits);
  Tally placed;  // the CPU saw the inf/NaN placed (else the case proves nothing)
  if ((where != 0 || found_start != 0) != (found->hp<float>()[0] == 1.0f)) placed.bad = placed.total = 1;
  placed.first = "the CPU's found_inf";
  report(label, "found_inf as placed", placed);
  timer.done(label);
}

void scaler_update_sequence(int flags, int64_t interval, double growth, float start_scale) {
  CaseTimer timer;
  char label[140];
  std::snprintf(label, sizeof label, "scaler_update %2d flags interval %ld growth %g from %g", flags,
                static_cast<long>(interval), growth, start_scale);
  auto scale = scalar(Elem::f32, start_scale, "scale");
  auto tracker = twin(Elem::i32, 1, "growth_tracker", [](int64_t) { return 0; });
  auto found = twin(Elem::f32, flags, "found_infs", [](int64_t) { return 0.0; });
  std::vector<const float*> dev(flags), host(flags);
  for (int i = 0; i < flags; ++i) {
    dev[i] = found->dp<float>() + i;
    host[i] = found->hp<float>() + i;
  }
  for (int step = 0; step < 12; ++step) {
    // An inf on steps 4 and 9 (in the last flag, or the first), else clear.
    for (int i = 0; i < flags; ++i) {
      const float value = (step == 4 && i == flags - 1) || (step == 9 && i == 0) ? 1.0f : 0.0f;
      found->dp<float>()[i] = found->hp<float>()[i] = value;
    }
    grad_scaler_update_cpu(scale->hp<float>(), tracker->hp<int32_t>(), host.data(), flags, growth, 0.5, interval);
    run_cuda(label, [&] {
      grad_scaler_update_cuda(scale->dp<float>(), tracker->dp<int32_t>(), dev.data(), flags, growth, 0.5, interval,
                              nullptr);
    });
    const std::string at = std::string(label) + " step " + std::to_string(step);
    check(at, "scale", {scale.get()}, Mode::bits);
    check(at, "growth tracker", {tracker.get()}, Mode::bits);
  }
  char extra[80];
  std::snprintf(extra, sizeof extra, "scale %g tracker %d ", scale->hp<float>()[0], tracker->hp<int32_t>()[0]);
  timer.done(label, extra);
}

void norm_case(Elem e, const std::vector<int64_t>& sizes, double norm_type, int where) {
  CaseTimer timer;
  char label[140];
  std::snprintf(label, sizeof label, "grad norm %-4s n %3zu p %-4g %s", elem_name(e), sizes.size(), norm_type,
                where == 0 ? "" : where == 1 ? "inf" : "NaN");
  GradList g = make_grads(e, sizes, 23, 2.0, specials(where, sizes.size()));
  const int64_t count = static_cast<int64_t>(sizes.size()), chunks = total_chunks(sizes);
  auto partials = poisoned(Elem::f64, chunks, "norm partials");
  grad_norm_partials_cpu(dtype_of(e), g.host.data(), count, norm_type, partials->hp<double>());
  run_cuda(label, [&] { grad_norm_partials_cuda(dtype_of(e), g.dev.data(), count, norm_type, partials->dp<double>(), nullptr); });
  check_untouched(label, "grads", g.twins);
  if (std::isinf(norm_type)) {
    check(label, "partials (max)", {partials.get()}, Mode::nan_equal);
  } else {
    check(label, "partials", {partials.get()}, Mode::tolerance, kSumPartials);
  }
  // Stage 2 on each side's own partials; with a clip coefficient below 1, 1, and none.
  const Allowed two_ulps = [](double want, double) { return 2 * ulp(Elem::f32, want); };
  std::string extra;
  for (double max_norm : {1.0, 1e9, -1.0}) {
    auto total = poisoned(Elem::f32, 1, "total_norm"), coef = poisoned(Elem::f32, 1, "clip_coef");
    const bool with_coef = max_norm > 0;
    grad_norm_finish_cpu(partials->hp<double>(), chunks, norm_type, max_norm, total->hp<float>(),
                         with_coef ? coef->hp<float>() : nullptr);
    run_cuda(label, [&] {
      grad_norm_finish_cuda(partials->dp<double>(), chunks, norm_type, max_norm, total->dp<float>(),
                            with_coef ? coef->dp<float>() : nullptr, nullptr);
    });
    check(label, "total norm", {total.get()}, Mode::tolerance, two_ulps);
    check(label, with_coef ? "clip coefficient" : "clip coefficient (none: untouched)", {coef.get()},
          with_coef ? Mode::tolerance : Mode::bits, two_ulps);
    if (max_norm == 1.0) extra = "total " + std::to_string(total->hp<float>()[0]) + " ";
  }
  timer.done(label, extra);
}

void norm_finish_case(int64_t count, double norm_type) {
  CaseTimer timer;
  char label[120];
  std::snprintf(label, sizeof label, "grad norm finish %4ld partials p %g", static_cast<long>(count), norm_type);
  auto partials = twin(Elem::f64, count, "partials", [](int64_t i) { return 0.5 + (i * 7919 % 1000) * 1e-3; });
  auto total = poisoned(Elem::f32, 1, "total_norm"), coef = poisoned(Elem::f32, 1, "clip_coef");
  grad_norm_finish_cpu(partials->hp<double>(), count, norm_type, 2.0, total->hp<float>(), coef->hp<float>());
  run_cuda(label, [&] {
    grad_norm_finish_cuda(partials->dp<double>(), count, norm_type, 2.0, total->dp<float>(), coef->dp<float>(), nullptr);
  });
  const Allowed two_ulps = [](double want, double) { return 2 * ulp(Elem::f32, want); };
  check(label, "total norm", {total.get()}, Mode::tolerance, two_ulps);
  check(label, "clip coefficient", {coef.get()}, Mode::tolerance, two_ulps);
  timer.done(label);
}

void grad_scale_case(Elem e, const std::vector<int64_t>& sizes, float coef_value) {
  CaseTimer timer;
  char label[120];
  std::snprintf(label, sizeof label, "grad_scale %-4s n %3zu coef %g", elem_name(e), sizes.size(), coef_value);
  GradList g = make_grads(e, sizes, 31, 1.0, [](int t, int64_t i, double v) {
    return i == 0 && t % 5 == 0 ? -INFINITY : i % 1001 == 3 ? 0.0 : v;
  });
  if (e == Elem::f32) {
    // Signalling-NaN bits (0x7f800001) at element 1: a kernel that writes them, even times 1, quiets them.
    for (Twin* x : g.twins) {
      if (x->n > 1) {
        const uint32_t bits = 0x7f800001u;
        std::memcpy(x->dp<float>() + 1, &bits, 4);
        std::memcpy(x->hp<float>() + 1, &bits, 4);
        std::memcpy(reinterpret_cast<float*>(x->initial.data()) + 1, &bits, 4);
      }
    }
  }
  auto coef = scalar(Elem::f32, coef_value, "coef");
  grad_scale_cpu(dtype_of(e), g.host.data(), static_cast<int64_t>(sizes.size()), coef->hp<float>());
  run_cuda(label, [&] { grad_scale_cuda(dtype_of(e), g.dev.data(), static_cast<int64_t>(sizes.size()), coef->dp<float>(), nullptr); });
  if (coef_value == 1.0f) {
    check_untouched(label, "grads (coef 1: nothing written)", g.twins);
  } else {
    check(label, "grads", g.twins, Mode::nan_equal);
  }
  timer.done(label);
}

void grad_clamp_case(Elem e, const std::vector<int64_t>& sizes, double clip) {
  CaseTimer timer;
  char label[120];
  std::snprintf(label, sizeof label, "grad_clamp %-4s n %3zu clip %g", elem_name(e), sizes.size(), clip);
  GradList g = make_grads(e, sizes, 37, 1.0, [](int t, int64_t i, double v) {
    if (i == 1 && t % 3 == 0) return static_cast<double>(NAN);
    if (i == 2 && t % 4 == 0) return static_cast<double>(t % 8 == 0 ? INFINITY : -INFINITY);
    return v;
  });
  grad_clamp_cpu(dtype_of(e), g.host.data(), static_cast<int64_t>(sizes.size()), clip);
  run_cuda(label, [&] { grad_clamp_cuda(dtype_of(e), g.dev.data(), static_cast<int64_t>(sizes.size()), clip, nullptr); });
  check(label, "grads", g.twins, Mode::nan_equal);
  timer.done(label);
}

// ---------------------------------------------------------------- averaging

template <typename T>
void average_case(const std::vector<int64_t>& sizes, const AverageConfig& config, Found skip) {
  CaseTimer timer;
  const Elem pe = elem_of<T>(), ae = std::is_same_v<T, double> ? Elem::f64 : Elem::f32;
  char label[160];
  std::snprintf(label, sizeof label, "average %-4s n %3zu %s %-4g %s", elem_name(pe), sizes.size(),
                config.divide ? "divisor" : "weight", config.divide ? config.divisor : config.weight,
                skip == Found::null ? "skip:null" : skip == Found::clear ? "skip:0" : "skip:set");
  GradList params = make_grads(pe, sizes, 41, 1.0);
  GradList averages = make_grads(ae, sizes, 43, 1.0);
  TwinPtr flag = scalar(Elem::f32, skip == Found::set ? 1.0 : 0.0, "skip_flag");
  const int64_t count = static_cast<int64_t>(sizes.size());
  average_update_cpu(dtype_of(pe), averages.host.data(), params.host.data(), count, config,
                     skip == Found::null ? nullptr : flag->hp<float>());
  run_cuda(label, [&] {
    average_update_cuda(dtype_of(pe), averages.dev.data(), params.dev.data(), count, config,
                        skip == Found::null ? nullptr : flag->dp<float>(), nullptr);
  });
  check_untouched(label, "params", params.twins);
  if (skip == Found::set) {
    check_untouched(label, "averages (skipped)", averages.twins);
  } else {
    check(label, "averages", averages.twins, Mode::bits);
  }
  timer.done(label);
}

void average_all() {
  const std::vector<int64_t> pairs = list_sizes(390, {{0, 3}, {1, 0}, {2, kOptimChunk + 1}, {383, 4097},
                                                      {386, 2 * kOptimChunk + 1}});
  const std::vector<int64_t> small = {5, kOptimChunk + 3};
  const AverageConfig ema{.weight = 0.1, .divisor = 1, .divide = false};
  const AverageConfig lerp{.weight = 0.75, .divisor = 1, .divide = false};
  const AverageConfig swa{.weight = 0, .divisor = 3, .divide = true};
  const AverageConfig copy{.weight = 0, .divisor = 1, .divide = true};
  average_case<float>(pairs, ema, Found::null);
  average_case<BFloat16>(pairs, swa, Found::clear);
  average_case<float>(pairs, lerp, Found::set);
  average_case<double>(small, ema, Found::clear);
  average_case<double>(small, swa, Found::null);
  average_case<Half>(small, lerp, Found::null);
  average_case<Half>(small, copy, Found::clear);
  average_case<BFloat16>(small, ema, Found::set);
  average_case<float>(small, copy, Found::null);
}

// ---------------------------------------------------------------- schedules

ScheduleGroup group_values(int g) {
  ScheduleGroup group;
  for (int k = 0; k < kScheduleMaxSegments; ++k) {
    ScheduleGroupValues& v = group.segments[k];
    v.base_lr = 0.1 / (g + 1) + 0.01 * k;
    v.max_lr = 0.5 / (g + 1) + 0.02 * k;
    v.min_lr = 1e-4 * (g + 1);
    v.base_momentum = 0.85 - 0.01 * g;
    v.max_momentum = 0.95 - 0.01 * g;
  }
  return group;
}

struct NamedProgram {
  const char* name;
  ScheduleProgram program;
};

std::vector<NamedProgram> schedule_programs() {
  std::vector<NamedProgram> programs;
  auto one = [&](const char* name, const ScheduleFormula& f) {
    ScheduleProgram p;
    p.n_segments = 1;
    p.segments[0] = f;
    programs.push_back({name, p});
  };
  ScheduleFormula f;
  f = {};
  one("constant", f);
  f = {};
  f.kind = ScheduleKind::step, f.period = 4, f.gamma = 0.5;
  one("step", f);
  f = {};
  f.kind = ScheduleKind::multi_step, f.gamma = 0.3, f.n_milestones = 3;
  f.milestones[0] = 3, f.milestones[1] = 7, f.milestones[2] = 20;
  one("multi_step", f);
  f = {};
  f.kind = ScheduleKind::exponential, f.gamma = 0.93;
  one("exponential", f);
  f = {};
  f.kind = ScheduleKind::cosine_warm_restarts, f.period = 3, f.period2 = 2, f.eta_min = 1e-3;
  one("cosine_warm_restarts", f);
  f = {};
  f.kind = ScheduleKind::one_cycle, f.period = 25, f.pct_start = 0.3, f.cycle_momentum = 1, f.three_phase = 1;
  one("one_cycle three-phase momentum", f);
  f = {};
  f.kind = ScheduleKind::one_cycle, f.period = 20, f.pct_start = 0.25, f.anneal = AnnealMode::linear;
  one("one_cycle linear", f);
  f = {};
  f.kind = ScheduleKind::cyclic, f.period = 4, f.period2 = 6, f.cyclic = CyclicMode::triangular2, f.cycle_momentum = 1;
  one("cyclic triangular2 momentum", f);
  f = {};
  f.kind = ScheduleKind::cyclic, f.period = 5, f.period2 = 5, f.cyclic = CyclicMode::exp_range, f.gamma = 0.97;
  one("cyclic exp_range", f);
  f = {};
  f.kind = ScheduleKind::swa, f.period = 5, f.anneal = AnnealMode::cos;
  one("swa (base_lr override)", f);
  {
    ScheduleProgram p;  // SequentialLR: linear warmup for 5 steps, then cosine, then exponential
    p.n_segments = 3;
    p.boundaries[0] = 5, p.boundaries[1] = 17;
    p.segments[0].kind = ScheduleKind::linear, p.segments[0].period = 5, p.segments[0].start_factor = 0.1;
    p.segments[1].kind = ScheduleKind::cosine, p.segments[1].period = 12, p.segments[1].eta_min = 1e-4;
    p.segments[2].kind = ScheduleKind::exponential, p.segments[2].gamma = 0.9;
    programs.push_back({"linear -> cosine -> exponential", p});
  }
  for (NamedProgram& p : programs) {
    for (int g = 0; g < 3; ++g) p.program.groups.push_back(group_values(g));
  }
  return programs;
}

void schedule_case(const NamedProgram& named) {
  CaseTimer timer;
  const std::string label = std::string("schedule ") + named.name;
  const ScheduleProgram& program = named.program;
  const int groups = static_cast<int>(program.groups.size());
  auto epoch = scalar(Elem::i64, -1, "last_epoch");
  auto lr = twin(Elem::f64, groups, "lr", [](int64_t) { return -7.0; });
  auto momentum = twin(Elem::f64, groups, "momentum", [](int64_t) { return -9.0; });  // unset: stays -9
  auto base = twin(Elem::f64, groups, "base_lr", [](int64_t g) { return 0.07 * (g + 1); });
  auto found = scalar(Elem::f32, 0.0, "found_inf");
  // Group 1 has no momentum slot, group 2 no base_lr override.
  std::vector<double*> lr_d(groups), lr_h(groups), m_d(groups), m_h(groups);
  std::vector<const double*> b_d(groups), b_h(groups);
  for (int g = 0; g < groups; ++g) {
    lr_d[g] = lr->dp<double>() + g, lr_h[g] = lr->hp<double>() + g;
    m_d[g] = g == 1 ? nullptr : momentum->dp<double>() + g, m_h[g] = g == 1 ? nullptr : momentum->hp<double>() + g;
    b_d[g] = g == 2 ? nullptr : base->dp<double>() + g, b_h[g] = g == 2 ? nullptr : base->hp<double>() + g;
  }
  const bool override_base = program.segments[0].kind == ScheduleKind::swa;
  for (int step = 0; step < 30; ++step) {
    const bool advance = step % 7 != 3;
    const float flag = step % 5 == 2 ? 1.0f : 0.0f;
    found->dp<float>()[0] = found->hp<float>()[0] = flag;
    const float* f_h = step % 2 == 0 ? found->hp<float>() : nullptr;
    const float* f_d = step % 2 == 0 ? found->dp<float>() : nullptr;
    schedule_step_cpu(program, epoch->hp<int64_t>(), f_h, advance, lr_h.data(), m_h.data(),
                      override_base ? b_h.data() : nullptr);
    run_cuda(label, [&] {
      schedule_step_cuda(program, epoch->dp<int64_t>(), f_d, advance, lr_d.data(), m_d.data(),
                         override_base ? b_d.data() : nullptr, nullptr);
    });
    const std::string at = label + " step " + std::to_string(step);
    check(at, "last_epoch", {epoch.get()}, Mode::bits);
    check(at, "lr", {lr.get()}, Mode::bits);
    check(at, "momentum", {momentum.get()}, Mode::bits);
  }
  char extra[120];
  std::snprintf(extra, sizeof extra, "epoch %ld lr %.6g momentum %.6g ", static_cast<long>(epoch->hp<int64_t>()[0]),
                lr->hp<double>()[0], momentum->hp<double>()[0]);
  timer.done(label, extra);
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  const std::string only = argc > 1 ? argv[1] : "";  // optimizers|prologue|scaler|clip|average|schedule
  auto want = [&](const char* part) { return only.empty() || only == part; };
  std::printf("multi-tensor metas passed by value: OptimMeta %zu bytes (%d tensors), ListMeta %zu (%d), PairMeta %zu (%d)\n",
              sizeof(mta::OptimMeta), mta::OptimMeta::kMaxTensors, sizeof(mta::ListMeta), mta::ListMeta::kMaxTensors,
              sizeof(mta::PairMeta), mta::PairMeta::kMaxTensors);
  if (want("prologue")) {
    for (int64_t count : {0, 1, 999, 1000, 1001, 2345}) {
      for (Found found : {Found::null, Found::clear, Found::set}) prologue_case(count, count % 2 == 1, found);
    }
    prologue_case(1001, false, Found::clear);
  }
  if (want("schedule")) {
    for (const NamedProgram& p : schedule_programs()) schedule_case(p);
  }
  const std::vector<int64_t> grads = grad_list();  // 520 tensors: two ListMeta launches
  const std::vector<int64_t> small = {1, 3, kOptimChunk + 1, 0, 4097};
  const Elem all[] = {Elem::f32, Elem::f64, Elem::f16, Elem::bf16};
  if (want("scaler")) {
    unscale_case(Elem::f32, grads, 65536.0f, 0.0f, 0);
    unscale_case(Elem::bf16, grads, 3.0f, 0.0f, 2);
    unscale_case(Elem::f16, grads, 1.0f, 0.0f, 1);
    for (Elem e : all) {
      unscale_case(e, small, 3.0f, 0.0f, 0);
      unscale_case(e, small, 1.0f, 1.0f, 0);  // found_inf stays 1
      unscale_case(e, small, 1024.0f, 0.0f, 1);
      unscale_case(e, small, 65536.0f, 0.0f, 2);
    }
    scaler_update_sequence(1, 3, 2.0, 65536.0f);
    scaler_update_sequence(3, 1, 2.0, 1024.0f);
    scaler_update_sequence(16, 2, 1.5, 3.0e38f);  // growth overflows: the scale is kept
    scaler_update_sequence(kGradScalerMaxFoundInf, 1000, 2.0, 1.0f);
  }
  if (want("clip")) {
    // The long list (block reductions: slow to emulate) for p = 2 (with a NaN in the second launch), inf and 3.
    norm_case(Elem::f32, grads, 2.0, 2);
    norm_case(Elem::f16, grads, static_cast<double>(INFINITY), 0);
    norm_case(Elem::bf16, grads, 3.0, 0);
    for (double p : {2.0, 1.0, static_cast<double>(INFINITY), 3.0, 0.5}) {
      for (Elem e : all) norm_case(e, small, p, 0);
      norm_case(Elem::f32, small, p, 1);
      norm_case(Elem::bf16, small, p, 2);
    }
    for (int64_t count : {0, 1, 3, 1500}) norm_finish_case(count, count == 3 ? 1.0 : 2.0);
    norm_finish_case(1500, static_cast<double>(INFINITY));
    grad_scale_case(Elem::f32, grads, 0.37f);
    grad_scale_case(Elem::f32, grads, 1.0f);
    for (Elem e : all) grad_scale_case(e, small, 0.37f);
    grad_scale_case(Elem::bf16, small, 1.0f);
    grad_clamp_case(Elem::bf16, grads, 0.5);
    for (Elem e : all) grad_clamp_case(e, small, 0.5);
  }
  if (want("average")) average_all();
  if (want("optimizers")) optim_all();
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
