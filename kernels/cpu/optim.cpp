// CPU optimizer, scaler, clipping, averaging and schedule kernels. The work
// items are the kOptimChunk-element chunks of every tensor of a list, shared
// out by OpenMP; inner loops run over contiguous memory with the element
// arithmetic of kernels/optim_math.h. Reductions keep one partial per chunk
// and combine them in order, so results do not depend on the thread count.
// The update loops vectorize only without errno-setting sqrt: this file is
// compiled with -fno-math-errno (set in optim/CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/optim.h"
#include "kernels/optim_math.h"

namespace kiln::kernels {

namespace {
using namespace optim_math;

constexpr int64_t kParallelElements = 1 << 15;

struct ChunkRef {
  int64_t tensor;
  int64_t chunk;      // index within the tensor
  int64_t global;     // index over the whole list (partials)
};

// Calls fn(tensor, global_chunk, begin, length) for every chunk of the list.
template <typename NumelOf, typename Fn>
void for_each_chunk(int64_t count, NumelOf numel_of, Fn&& fn) {
  std::vector<ChunkRef> chunks;
  int64_t total = 0;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t numel = numel_of(t);
    for (int64_t c = 0; c < optim_chunks(numel); ++c) {
      chunks.push_back({t, c, static_cast<int64_t>(chunks.size())});
    }
    total += numel;
  }
  const int64_t n = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (total > kParallelElements && n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const ChunkRef& ref = chunks[i];
    const int64_t begin = ref.chunk * kOptimChunk;
    const int64_t length = std::min(kOptimChunk, numel_of(ref.tensor) - begin);
    fn(ref.tensor, ref.global, begin, length);
  }
}

template <typename T>
constexpr bool is_16bit = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename C, typename T>
inline C load(const T* data, int64_t i) {
  if constexpr (is_16bit<T>) {
    return static_cast<C>(static_cast<float>(data[i]));
  } else {
    return static_cast<C>(data[i]);
  }
}

template <typename T, typename C>
inline void store(T* data, int64_t i, C value) {
  if constexpr (is_16bit<T>) {
    data[i] = T(static_cast<float>(value));
  } else {
    data[i] = static_cast<T>(value);
  }
}

// Optimizer params are f32, f64, f16 or bf16.
template <typename Fn>
void dispatch_param(DType dtype, const char* op, Fn&& fn) {
  dispatch_floating(dtype, op, std::forward<Fn>(fn));
}

bool skipped(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }
double grad_scale_of(const OptimScalars& s) { return s.grad_scale != nullptr ? *s.grad_scale : 1.0; }

// The type a param's optimizer state is kept in: the compute type, except for
// a 16-bit param without an fp32 master (bf16-true), whose state is in its own type.
template <typename T, bool kMaster>
using state_t = std::conditional_t<is_16bit<T> && !kMaster, T, compute_t<T>>;

// fn.template operator()<S>() with S the state type of `x` (see state_t).
template <typename T, typename Fn>
void with_state_type(const OptimTensor& x, Fn&& fn) {
  if constexpr (is_16bit<T>) {
    if (x.master == nullptr) {
      fn.template operator()<T>();
      return;
    }
  }
  fn.template operator()<compute_t<T>>();
}

// The param value the update starts from: the fp32 master when there is one.
template <typename C, typename T>
inline C load_param(const T* param, const float* master, int64_t i) {
  return master != nullptr ? static_cast<C>(master[i]) : load<C>(param, i);
}
template <typename C, typename T>
inline void store_param(T* param, float* master, int64_t i, C value) {
  if (master != nullptr) master[i] = static_cast<float>(value);
  store(param, i, value);
}

// ---------------------------------------------------------------- SGD
template <typename T, bool kMaster, bool kMomentum>
void sgd_loop(const OptimTensor& x, int64_t begin, int64_t length, const SgdScalars<compute_t<T>> s) {
  using C = compute_t<T>;
  T* __restrict p = static_cast<T*>(x.param) + begin;
  const T* __restrict g = static_cast<const T*>(x.grad) + begin;
  using S = state_t<T, kMaster>;
  float* __restrict master = kMaster ? x.master + begin : nullptr;
  S* __restrict buf = kMomentum ? static_cast<S*>(x.state[0]) + begin : nullptr;
  for (int64_t i = 0; i < length; ++i) {
    C value = kMaster ? static_cast<C>(master[i]) : load<C>(p, i);
    C b = kMomentum ? load<C>(buf, i) : C(0);
    sgd_element(value, load<C>(g, i), kMomentum ? &b : nullptr, s);
    if constexpr (kMomentum) store(buf, i, b);
    if constexpr (kMaster) master[i] = static_cast<float>(value);
    store(p, i, value);
  }
}

template <typename T>
void sgd_impl(const OptimTensor* tensors, int64_t count, const OptimScalars& scalars, const SgdConfig& config) {
  using C = compute_t<T>;
  const double lr = *scalars.lr, momentum = config.has_momentum ? *scalars.momentum : 0.0;
  const double grad_scale = grad_scale_of(scalars);
  for_each_chunk(count, [&](int64_t t) { return tensors[t].numel; },
                 [&](int64_t t, int64_t, int64_t begin, int64_t length) {
                   const OptimTensor& x = tensors[t];
                   const SgdScalars<C> s = sgd_scalars<C>(config, lr, momentum, *x.step, grad_scale);
                   const bool has_master = x.master != nullptr, has_momentum = x.state[0] != nullptr;
                   if (has_master && has_momentum) {
                     sgd_loop<T, true, true>(x, begin, length, s);
                   } else if (has_master) {
                     sgd_loop<T, true, false>(x, begin, length, s);
                   } else if (has_momentum) {
                     sgd_loop<T, false, true>(x, begin, length, s);
                   } else {
                     sgd_loop<T, false, false>(x, begin, length, s);
                   }
                 });
}

// ---------------------------------------------------------------- Adam
template <typename T, bool kMaster, bool kAmsgrad>
void adam_loop(const OptimTensor& x, int64_t begin, int64_t length, const AdamScalars<compute_t<T>> s) {
  using C = compute_t<T>;
  T* __restrict p = static_cast<T*>(x.param) + begin;
  const T* __restrict g = static_cast<const T*>(x.grad) + begin;
  using S = state_t<T, kMaster>;
  float* __restrict master = kMaster ? x.master + begin : nullptr;
  S* __restrict m = static_cast<S*>(x.state[0]) + begin;
  S* __restrict v = static_cast<S*>(x.state[1]) + begin;
  S* __restrict vmax = kAmsgrad ? static_cast<S*>(x.state[2]) + begin : nullptr;
  for (int64_t i = 0; i < length; ++i) {
    C value = kMaster ? static_cast<C>(master[i]) : load<C>(p, i);
    C mi = load<C>(m, i), vi = load<C>(v, i);
    C vmax_i = kAmsgrad ? load<C>(vmax, i) : C(0);
    adam_element(value, load<C>(g, i), mi, vi, kAmsgrad ? &vmax_i : nullptr, s);
    store(m, i, mi);
    store(v, i, vi);
    if constexpr (kAmsgrad) store(vmax, i, vmax_i);
    if constexpr (kMaster) master[i] = static_cast<float>(value);
    store(p, i, value);
  }
}

template <typename T>
void adam_impl(const OptimTensor* tensors, int64_t count, const OptimScalars& scalars, const AdamConfig& config) {
  using C = compute_t<T>;
  const double lr = *scalars.lr, beta1 = *scalars.momentum, grad_scale = grad_scale_of(scalars);
  for_each_chunk(count, [&](int64_t t) { return tensors[t].numel; },
                 [&](int64_t t, int64_t, int64_t begin, int64_t length) {
                   const OptimTensor& x = tensors[t];
                   const AdamScalars<C> s = adam_scalars<C>(config, lr, beta1, *x.step, grad_scale);
                   const bool has_master = x.master != nullptr;
                   if (has_master && config.amsgrad) {
                     adam_loop<T, true, true>(x, begin, length, s);
                   } else if (has_master) {
                     adam_loop<T, true, false>(x, begin, length, s);
                   } else if (config.amsgrad) {
                     adam_loop<T, false, true>(x, begin, length, s);
                   } else {
                     adam_loop<T, false, false>(x, begin, length, s);
                   }
                 });
}

// ---------------------------------------------------------------- LAMB / LARS
// Per-tensor sums of two chunk partials (partials[2 * chunk + k]), in chunk order.
std::vector<double> tensor_sums(const OptimTensor* tensors, int64_t count, const double* partials) {
  std::vector<double> sums(static_cast<size_t>(2 * count), 0.0);
  int64_t chunk = 0;
  for (int64_t t = 0; t < count; ++t) {
    for (int64_t c = 0; c < optim_chunks(tensors[t].numel); ++c, ++chunk) {
      sums[2 * t] += partials[2 * chunk];
      sums[2 * t + 1] += partials[2 * chunk + 1];
    }
  }
  return sums;
}

template <typename T>
void lamb_impl(const OptimTensor* tensors, int64_t count, const OptimScalars& scalars, const LambConfig& config,
               double* partials) {
  using C = compute_t<T>;
  const double lr = *scalars.lr, beta1 = *scalars.momentum, grad_scale = grad_scale_of(scalars);
  auto numel_of = [&](int64_t t) { return tensors[t].numel; };
  for_each_chunk(count, numel_of, [&](int64_t t, int64_t global, int64_t begin, int64_t length) {
    const OptimTensor& x = tensors[t];
    const LambScalars<C> s = lamb_scalars<C>(config, beta1, *x.step, grad_scale);
    const T* p = static_cast<const T*>(x.param) + begin;
    const float* master = x.master != nullptr ? x.master + begin : nullptr;
    const T* g = static_cast<const T*>(x.grad) + begin;
    double param_sq = 0, update_sq = 0;
    with_state_type<T>(x, [&]<typename S>() {
      S* m = static_cast<S*>(x.state[0]) + begin;
      S* v = static_cast<S*>(x.state[1]) + begin;
      for (int64_t i = 0; i < length; ++i) {
        const C value = load_param<C>(p, master, i);
        C mi = load<C>(m, i), vi = load<C>(v, i);
        C u = lamb_moments(value, load<C>(g, i), mi, vi, s);
        store(m, i, mi);
        store(v, i, vi);
        // 16-bit state: the norm is of the update stage 2 makes from the stored (rounded) moments.
        if constexpr (!std::is_same_v<S, C>) u = lamb_direction(value, load<C>(m, i), load<C>(v, i), s);
        param_sq += static_cast<double>(value) * static_cast<double>(value);
        update_sq += static_cast<double>(u) * static_cast<double>(u);
      }
    });
    partials[2 * global] = param_sq;
    partials[2 * global + 1] = update_sq;
  });
  const std::vector<double> sums = tensor_sums(tensors, count, partials);
  for_each_chunk(count, numel_of, [&](int64_t t, int64_t, int64_t begin, int64_t length) {
    const OptimTensor& x = tensors[t];
    const LambScalars<C> s = lamb_scalars<C>(config, beta1, *x.step, grad_scale);
    const C step = static_cast<C>(lr * lamb_trust_ratio(sums[2 * t], sums[2 * t + 1]));
    T* p = static_cast<T*>(x.param) + begin;
    float* master = x.master != nullptr ? x.master + begin : nullptr;
    with_state_type<T>(x, [&]<typename S>() {
      const S* m = static_cast<const S*>(x.state[0]) + begin;
      const S* v = static_cast<const S*>(x.state[1]) + begin;
      for (int64_t i = 0; i < length; ++i) {
        C value = load_param<C>(p, master, i);
        value -= step * lamb_direction(value, load<C>(m, i), load<C>(v, i), s);
        store_param(p, master, i, value);
      }
    });
  });
}

template <typename T>
void lars_impl(const OptimTensor* tensors, int64_t count, const OptimScalars& scalars, const LarsConfig& config,
               double* partials) {
  using C = compute_t<T>;
  const double lr = *scalars.lr, momentum = config.has_momentum ? *scalars.momentum : 0.0;
  const double grad_scale = grad_scale_of(scalars);
  auto numel_of = [&](int64_t t) { return tensors[t].numel; };
  for_each_chunk(count, numel_of, [&](int64_t t, int64_t global, int64_t begin, int64_t length) {
    const OptimTensor& x = tensors[t];
    const T* p = static_cast<const T*>(x.param) + begin;
    const float* master = x.master != nullptr ? x.master + begin : nullptr;
    const T* g = static_cast<const T*>(x.grad) + begin;
    const C gs = static_cast<C>(grad_scale);
    double param_sq = 0, grad_sq = 0;
    for (int64_t i = 0; i < length; ++i) {
      const double value = static_cast<double>(load_param<C>(p, master, i));
      const double grad = static_cast<double>(load<C>(g, i) * gs);
      param_sq += value * value;
      grad_sq += grad * grad;
    }
    partials[2 * global] = param_sq;
    partials[2 * global + 1] = grad_sq;
  });
  const std::vector<double> sums = tensor_sums(tensors, count, partials);
  for_each_chunk(count, numel_of, [&](int64_t t, int64_t, int64_t begin, int64_t length) {
    const OptimTensor& x = tensors[t];
    const double ratio = lars_trust_ratio(config, sums[2 * t], sums[2 * t + 1]);
    LarsScalars<C> s;
    s.lr = static_cast<C>(lr);
    s.momentum = static_cast<C>(momentum);
    s.weight_decay = static_cast<C>(config.weight_decay);
    s.ratio = static_cast<C>(ratio);
    s.grad_scale = static_cast<C>(grad_scale);
    s.adapt = ratio != 0.0;
    s.first = *x.step <= 1;
    T* p = static_cast<T*>(x.param) + begin;
    float* master = x.master != nullptr ? x.master + begin : nullptr;
    const T* g = static_cast<const T*>(x.grad) + begin;
    with_state_type<T>(x, [&]<typename S>() {
      S* buf = x.state[0] != nullptr ? static_cast<S*>(x.state[0]) + begin : nullptr;
      for (int64_t i = 0; i < length; ++i) {
        C value = load_param<C>(p, master, i);
        C b = buf != nullptr ? load<C>(buf, i) : C(0);
        lars_element(value, load<C>(g, i), buf != nullptr ? &b : nullptr, s);
        if (buf != nullptr) store(buf, i, b);
        store_param(p, master, i, value);
      }
    });
  });
}
}  // namespace

void optim_step_prologue_cpu(int64_t* global_step, int64_t* const* param_steps, int64_t count,
                             const float* found_inf) {
  if (skipped(found_inf)) return;
  if (global_step != nullptr) ++*global_step;
  for (int64_t i = 0; i < count; ++i) ++*param_steps[i];
}

void sgd_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                  const SgdConfig& config) {
  if (count == 0 || skipped(scalars.found_inf)) return;
  dispatch_param(dtype, "sgd", [&]<typename T>() { sgd_impl<T>(tensors, count, scalars, config); });
}

void adam_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const AdamConfig& config) {
  if (count == 0 || skipped(scalars.found_inf)) return;
  dispatch_param(dtype, "adam", [&]<typename T>() { adam_impl<T>(tensors, count, scalars, config); });
}

void lamb_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const LambConfig& config, double* partials) {
  if (count == 0 || skipped(scalars.found_inf)) return;
  dispatch_param(dtype, "lamb", [&]<typename T>() { lamb_impl<T>(tensors, count, scalars, config, partials); });
}

void lars_step_cpu(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const LarsConfig& config, double* partials) {
  if (count == 0 || skipped(scalars.found_inf)) return;
  dispatch_param(dtype, "lars", [&]<typename T>() { lars_impl<T>(tensors, count, scalars, config, partials); });
}

// ---------------------------------------------------------------- grad scaler
void grad_scaler_unscale_cpu(DType dtype, const ListTensor* grads, int64_t count, const float* scale,
                             float* found_inf) {
  if (count == 0) return;
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(*scale));
  int64_t chunks = 0;
  for (int64_t t = 0; t < count; ++t) chunks += optim_chunks(grads[t].numel);
  std::vector<unsigned char> nonfinite(static_cast<size_t>(chunks), 0);
  dispatch_param(dtype, "grad_scaler_unscale", [&]<typename T>() {
    for_each_chunk(count, [&](int64_t t) { return grads[t].numel; },
                   [&](int64_t t, int64_t global, int64_t begin, int64_t length) {
                     T* g = static_cast<T*>(grads[t].data) + begin;
                     bool bad = false;
                     for (int64_t i = 0; i < length; ++i) {
                       const compute_t<T> value = load<compute_t<T>>(g, i);
                       bad |= !std::isfinite(value);
                       store(g, i, inv_scale == 1.0f ? value : value * static_cast<compute_t<T>>(inv_scale));
                     }
                     nonfinite[global] = bad;
                   });
  });
  for (unsigned char bad : nonfinite) {
    if (bad) *found_inf = 1.0f;
  }
}

void grad_scaler_update_cpu(float* scale, int32_t* growth_tracker, const float* const* found_infs, int count,
                            double growth_factor, double backoff_factor, int64_t growth_interval) {
  float found = 0.0f;
  for (int i = 0; i < count; ++i) found += *found_infs[i];
  if (found != 0.0f) {
    *scale *= static_cast<float>(backoff_factor);
    *growth_tracker = 0;
    return;
  }
  const int32_t successful = *growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = *scale * static_cast<float>(growth_factor);
    if (std::isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
  }
}

// ---------------------------------------------------------------- clipping
void grad_norm_partials_cpu(DType dtype, const ListTensor* grads, int64_t count, double norm_type, double* partials) {
  const int mode = norm_mode(norm_type);
  dispatch_param(dtype, "grad_norm", [&]<typename T>() {
    for_each_chunk(count, [&](int64_t t) { return grads[t].numel; },
                   [&](int64_t t, int64_t global, int64_t begin, int64_t length) {
                     const T* g = static_cast<const T*>(grads[t].data) + begin;
                     double acc = 0.0;
                     if (mode == 1) {
#pragma omp simd reduction(+ : acc)
                       for (int64_t i = 0; i < length; ++i) {
                         const double x = static_cast<double>(load<compute_t<T>>(g, i));
                         acc += x * x;
                       }
                     } else if (mode == 2) {
                       for (int64_t i = 0; i < length; ++i) {
                         acc = norm_combine(acc, norm_element(static_cast<double>(load<compute_t<T>>(g, i)), norm_type, mode),
                                            true);
                       }
                     } else {
                       for (int64_t i = 0; i < length; ++i) {
                         acc += norm_element(static_cast<double>(load<compute_t<T>>(g, i)), norm_type, mode);
                       }
                     }
                     partials[global] = acc;
                   });
  });
}

void grad_norm_finish_cpu(const double* partials, int64_t count, double norm_type, double max_norm,
                          float* total_norm, float* clip_coef) {
  const int mode = norm_mode(norm_type);
  double combined = 0.0;
  for (int64_t i = 0; i < count; ++i) combined = norm_combine(combined, partials[i], mode == 2);
  const float total = static_cast<float>(norm_finish(combined, norm_type, mode));
  *total_norm = total;
  if (clip_coef != nullptr) *clip_coef = clip_coefficient(max_norm, total);
}

void grad_scale_cpu(DType dtype, const ListTensor* grads, int64_t count, const float* coef) {
  const float c = *coef;
  if (c == 1.0f) return;
  dispatch_param(dtype, "grad_scale", [&]<typename T>() {
    for_each_chunk(count, [&](int64_t t) { return grads[t].numel; },
                   [&](int64_t t, int64_t, int64_t begin, int64_t length) {
                     T* g = static_cast<T*>(grads[t].data) + begin;
                     for (int64_t i = 0; i < length; ++i) {
                       store(g, i, load<compute_t<T>>(g, i) * static_cast<compute_t<T>>(c));
                     }
                   });
  });
}

void grad_clamp_cpu(DType dtype, const ListTensor* grads, int64_t count, double clip_value) {
  dispatch_param(dtype, "clip_grad_value", [&]<typename T>() {
    using C = compute_t<T>;
    const C hi = static_cast<C>(clip_value), lo = -hi;
    for_each_chunk(count, [&](int64_t t) { return grads[t].numel; },
                   [&](int64_t t, int64_t, int64_t begin, int64_t length) {
                     T* g = static_cast<T*>(grads[t].data) + begin;
                     for (int64_t i = 0; i < length; ++i) {
                       const C x = load<C>(g, i);
                       store(g, i, x < lo ? lo : (x > hi ? hi : x));  // NaN compares false: stays NaN
                     }
                   });
  });
}

// ---------------------------------------------------------------- averaging
void average_update_cpu(DType param_dtype, const ListTensor* averages, const ListTensor* params, int64_t count,
                        const AverageConfig& config, const float* skip_flag) {
  if (count == 0 || skipped(skip_flag)) return;
  dispatch_param(param_dtype, "average_update", [&]<typename T>() {
    using A = compute_t<T>;
    const A weight = static_cast<A>(config.weight), divisor = static_cast<A>(config.divisor);
    const bool divide = config.divide;
    for_each_chunk(count, [&](int64_t t) { return params[t].numel; },
                   [&](int64_t t, int64_t, int64_t begin, int64_t length) {
                     A* avg = static_cast<A*>(averages[t].data) + begin;
                     const T* p = static_cast<const T*>(params[t].data) + begin;
                     for (int64_t i = 0; i < length; ++i) {
                       avg[i] = average_element(avg[i], load<A>(p, i), weight, divisor, divide);
                     }
                   });
  });
}

// ---------------------------------------------------------------- schedules
void schedule_step_cpu(const ScheduleProgram& program, int64_t* last_epoch, const float* found_inf, bool advance,
                       double* const* lr, double* const* momentum, const double* const* base_lr) {
  if (advance && !skipped(found_inf)) ++*last_epoch;
  for (size_t g = 0; g < program.groups.size(); ++g) {
    const double base = base_lr != nullptr && base_lr[g] != nullptr ? *base_lr[g] : NAN;
    const ScheduleValue value = schedule_program_value(program, program.groups[g], *last_epoch, base);
    *lr[g] = value.lr;
    if (value.has_momentum && momentum != nullptr && momentum[g] != nullptr) *momentum[g] = value.momentum;
  }
}

}  // namespace kiln::kernels
