// CUDA optimizer, scaler, clipping, averaging and schedule kernels.
//
// Invariants: every list kernel is a multi-tensor launch (multi_tensor_apply.cuh)
// with one block per chunk; step-dependent values are read from device memory
// (nothing here is copied to the host); an optimizer kernel returns at once
// when *found_inf != 0; reductions are deterministic (per-chunk partials
// combined in a fixed order). The element arithmetic is kernels/optim_math.h,
// the same code the CPU kernels run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/multi_tensor_apply.cuh"
#include "kernels/optim.h"
#include "kernels/optim_math.h"

namespace kiln::kernels {

namespace {
using namespace optim_math;
using mta::ListMeta;
using mta::OptimMeta;
using mta::PairMeta;
using mta::device_compute_t;
using mta::device_t;
using mta::from_compute;
using mta::kThreads;
using mta::to_compute;

cudaStream_t as_cuda(cuda::Stream stream) { return static_cast<cudaStream_t>(stream); }

__device__ inline bool skip_step(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }
__device__ inline double grad_scale_of(const OptimScalars& s) { return s.grad_scale != nullptr ? *s.grad_scale : 1.0; }

// The chunk of block blockIdx.x: its slot, first element and length.
template <typename Meta>
struct Chunk {
  int slot;
  int64_t chunk;
  int64_t begin;
  int64_t length;
};
template <typename Meta>
__device__ inline Chunk<Meta> this_chunk(const Meta& meta) {
  Chunk<Meta> c;
  mta::locate(meta, static_cast<int>(blockIdx.x), c.slot, c.chunk);
  c.begin = c.chunk * kOptimChunk;
  const int64_t left = meta.numel[c.slot] - c.begin;
  c.length = left < kOptimChunk ? left : kOptimChunk;
  return c;
}

template <typename T, typename C>
__device__ inline C load_param(const T* __restrict__ p, const float* __restrict__ master, int64_t i) {
  return master != nullptr ? static_cast<C>(master[i]) : static_cast<C>(to_compute(p[i]));
}
template <typename T, typename C>
__device__ inline void store_param(T* __restrict__ p, float* __restrict__ master, int64_t i, C value) {
  if (master != nullptr) master[i] = static_cast<float>(value);
  p[i] = from_compute<T>(value);
}

// One optimizer state buffer of a param (null when unused): in the compute
// type, except for a 16-bit param without an fp32 master (bf16-true), whose
// state is in its own type (`narrow`; the same for every element of a block).
template <typename T>
struct StatePointer {
  using C = device_compute_t<T>;
  void* data;
  bool narrow;
  __device__ bool present() const { return data != nullptr; }
  __device__ C get(int64_t i) const {
    if (narrow) return static_cast<C>(to_compute(static_cast<const T*>(data)[i]));
    return static_cast<const C*>(data)[i];
  }
  __device__ void set(int64_t i, C value) const {
    if (narrow) {
      static_cast<T*>(data)[i] = from_compute<T>(value);
    } else {
      static_cast<C*>(data)[i] = value;
    }
  }
};

template <typename T>
struct OptimPointers {
  T* __restrict__ p;
  const T* __restrict__ g;
  float* __restrict__ master;
  StatePointer<T> s0, s1, s2;
};
template <typename U>
__device__ inline U* offset_or_null(void* base, int64_t begin) {
  return base == nullptr ? nullptr : static_cast<U*>(base) + begin;
}
template <typename T>
__device__ inline StatePointer<T> state_pointer(void* base, bool narrow, int64_t begin) {
  using C = device_compute_t<T>;
  return {narrow ? static_cast<void*>(offset_or_null<T>(base, begin)) : static_cast<void*>(offset_or_null<C>(base, begin)),
          narrow};
}
template <typename T>
__device__ inline OptimPointers<T> optim_pointers(const OptimMeta& meta, int slot, int64_t begin) {
  OptimPointers<T> x;
  x.p = offset_or_null<T>(meta.addresses[0][slot], begin);
  x.g = offset_or_null<T>(meta.addresses[1][slot], begin);
  x.master = offset_or_null<float>(meta.addresses[2][slot], begin);
  const bool narrow = sizeof(T) == 2 && x.master == nullptr;
  x.s0 = state_pointer<T>(meta.addresses[3][slot], narrow, begin);
  x.s1 = state_pointer<T>(meta.addresses[4][slot], narrow, begin);
  x.s2 = state_pointer<T>(meta.addresses[5][slot], narrow, begin);
  return x;
}

void fill_optim(OptimMeta& meta, int slot, const OptimTensor& x) {
  meta.addresses[0][slot] = x.param;
  meta.addresses[1][slot] = x.grad;
  meta.addresses[2][slot] = x.master;
  for (int k = 0; k < 3; ++k) meta.addresses[3 + k][slot] = x.state[k];
  meta.steps[slot] = x.step;
}

// Launches kernel(meta, args...) over a list of `count` tensors, one block
// per chunk (several launches when the list outgrows one Meta); fill(meta,
// slot, t) stores tensor t's addresses, numel_of(t) its size.
template <typename Meta, typename NumelOf, typename Fill, typename Kernel, typename... Args>
void launch_chunks(int64_t count, NumelOf numel_of, Fill fill, cudaStream_t stream, const char* name, Kernel kernel,
                   Args... args) {
  mta::multi_tensor_apply<Meta>(count, numel_of, fill, [&](const Meta& meta, int blocks) {
    kernel<<<blocks, kThreads, 0, stream>>>(meta, args...);
    cuda::check_last_launch(name);
  });
}

template <typename Kernel, typename... Args>
void launch_optim(const OptimTensor* tensors, int64_t count, cudaStream_t stream, const char* name, Kernel kernel,
                  Args... args) {
  launch_chunks<OptimMeta>(
      count, [&](int64_t t) { return tensors[t].numel; },
      [&](OptimMeta& meta, int slot, int64_t t) { fill_optim(meta, slot, tensors[t]); }, stream, name, kernel,
      args...);
}

template <typename Kernel, typename... Args>
void launch_list(const ListTensor* tensors, int64_t count, cudaStream_t stream, const char* name, Kernel kernel,
                 Args... args) {
  launch_chunks<ListMeta>(
      count, [&](int64_t t) { return tensors[t].numel; },
      [&](ListMeta& meta, int slot, int64_t t) { meta.addresses[0][slot] = tensors[t].data; }, stream, name, kernel,
      args...);
}

// ---------------------------------------------------------------- prologue
constexpr int kMaxStepPointers = 1000;
struct StepPointers {
  int64_t* steps[kMaxStepPointers];
  int64_t* global;
  int32_t count;
};

__global__ void step_prologue_kernel(const __grid_constant__ StepPointers list, const float* found_inf) {
  if (skip_step(found_inf)) return;
  if (threadIdx.x == 0 && list.global != nullptr) ++*list.global;
  for (int i = threadIdx.x; i < list.count; i += blockDim.x) ++*list.steps[i];
}

// ---------------------------------------------------------------- SGD
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, SgdConfig config) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  const double momentum = config.has_momentum ? *scalars.momentum : 0.0;
  const SgdScalars<C> s = sgd_scalars<C>(config, *scalars.lr, momentum, *meta.steps[c.slot], grad_scale_of(scalars));
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    C value = load_param<T, C>(x.p, x.master, i);
    C buffer = x.s0.present() ? x.s0.get(i) : C(0);
    sgd_element(value, static_cast<C>(to_compute(x.g[i])), x.s0.present() ? &buffer : nullptr, s);
    if (x.s0.present()) x.s0.set(i, buffer);
    store_param<T, C>(x.p, x.master, i, value);
  }
}

// ---------------------------------------------------------------- Adam
template <typename T>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, AdamConfig config) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  const AdamScalars<C> s =
      adam_scalars<C>(config, *scalars.lr, *scalars.momentum, *meta.steps[c.slot], grad_scale_of(scalars));
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  const bool amsgrad = config.amsgrad;
  int64_t scalar_begin = 0;
  if constexpr (std::is_same_v<T, float>) {
    // float32 params (32-true, and 16-mixed's float32 weights): 16-byte loads
    // and stores, four elements per thread and iteration, when every buffer of
    // the chunk is 16-byte aligned. The scalar loop kept too few bytes in
    // flight: 81.9% of the copy rate on the H200 (issue 20 asks 90%). Same
    // element arithmetic as the scalar loop; the tail (length % 4) runs there.
    const auto aligned = [](const void* pointer) { return (reinterpret_cast<uintptr_t>(pointer) & 15) == 0; };
    if (x.master == nullptr && aligned(x.p) && aligned(x.g) && aligned(x.s0.data) && aligned(x.s1.data) &&
        (!amsgrad || aligned(x.s2.data))) {
      const int64_t vectors = c.length / 4;
      float4* __restrict__ p4 = reinterpret_cast<float4*>(x.p);
      const float4* __restrict__ g4 = reinterpret_cast<const float4*>(x.g);
      float4* __restrict__ m4 = static_cast<float4*>(x.s0.data);
      float4* __restrict__ v4 = static_cast<float4*>(x.s1.data);
      float4* __restrict__ vmax4 = amsgrad ? static_cast<float4*>(x.s2.data) : nullptr;
      for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
        float4 value = p4[j], m = m4[j], v = v4[j];
        const float4 g = g4[j];
        float4 vmax = amsgrad ? vmax4[j] : float4{0.0f, 0.0f, 0.0f, 0.0f};
        adam_element(value.x, g.x, m.x, v.x, amsgrad ? &vmax.x : nullptr, s);
        adam_element(value.y, g.y, m.y, v.y, amsgrad ? &vmax.y : nullptr, s);
        adam_element(value.z, g.z, m.z, v.z, amsgrad ? &vmax.z : nullptr, s);
        adam_element(value.w, g.w, m.w, v.w, amsgrad ? &vmax.w : nullptr, s);
        m4[j] = m;
        v4[j] = v;
        if (amsgrad) vmax4[j] = vmax;
        p4[j] = value;
      }
      scalar_begin = vectors * 4;
    }
  }
  for (int64_t i = scalar_begin + threadIdx.x; i < c.length; i += blockDim.x) {
    C value = load_param<T, C>(x.p, x.master, i);
    C m = x.s0.get(i), v = x.s1.get(i);
    C vmax = amsgrad ? x.s2.get(i) : C(0);
    adam_element(value, static_cast<C>(to_compute(x.g[i])), m, v, amsgrad ? &vmax : nullptr, s);
    x.s0.set(i, m);
    x.s1.set(i, v);
    if (amsgrad) x.s2.set(i, vmax);
    store_param<T, C>(x.p, x.master, i, value);
  }
}

// ---------------------------------------------------------------- LAMB / LARS
__device__ inline double sum_combine(double a, double b) { return a + b; }

// The per-tensor sums of the two partial series (sum over the tensor's chunks,
// in a fixed order), valid in every thread.
__device__ inline void tensor_sums(const OptimMeta& meta, int slot, const double* partials, double& first,
                                   double& second) {
  __shared__ double result[2];
  const int64_t base = meta.partial_base[slot], chunks = optim_chunks(meta.numel[slot]);
  double a = 0.0, b = 0.0;
  for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) {
    a += partials[2 * (base + k)];
    b += partials[2 * (base + k) + 1];
  }
  a = mta::block_reduce(a, sum_combine);
  b = mta::block_reduce(b, sum_combine);
  if (threadIdx.x == 0) {
    result[0] = a;
    result[1] = b;
  }
  __syncthreads();
  first = result[0];
  second = result[1];
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lamb_stage1_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, LambConfig config,
                       double* partials) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  const LambScalars<C> s = lamb_scalars<C>(config, *scalars.momentum, *meta.steps[c.slot], grad_scale_of(scalars));
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  double param_sq = 0.0, update_sq = 0.0;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const C value = load_param<T, C>(x.p, x.master, i);
    C m = x.s0.get(i), v = x.s1.get(i);
    C u = lamb_moments(value, static_cast<C>(to_compute(x.g[i])), m, v, s);
    x.s0.set(i, m);
    x.s1.set(i, v);
    // 16-bit state: the norm is of the update stage 2 makes from the stored (rounded) moments.
    if (x.s0.narrow) u = lamb_direction(value, x.s0.get(i), x.s1.get(i), s);
    param_sq += static_cast<double>(value) * static_cast<double>(value);
    update_sq += static_cast<double>(u) * static_cast<double>(u);
  }
  param_sq = mta::block_reduce(param_sq, sum_combine);
  update_sq = mta::block_reduce(update_sq, sum_combine);
  if (threadIdx.x == 0) {
    const int64_t index = meta.partial_base[c.slot] + c.chunk;
    partials[2 * index] = param_sq;
    partials[2 * index + 1] = update_sq;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lamb_stage2_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, LambConfig config,
                       const double* partials) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  double param_sq, update_sq;
  tensor_sums(meta, c.slot, partials, param_sq, update_sq);
  const LambScalars<C> s = lamb_scalars<C>(config, *scalars.momentum, *meta.steps[c.slot], grad_scale_of(scalars));
  const C step = static_cast<C>(*scalars.lr * lamb_trust_ratio(param_sq, update_sq));
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    C value = load_param<T, C>(x.p, x.master, i);
    value -= step * lamb_direction(value, x.s0.get(i), x.s1.get(i), s);
    store_param<T, C>(x.p, x.master, i, value);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lars_stage1_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, double* partials) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  const C gs = static_cast<C>(grad_scale_of(scalars));
  double param_sq = 0.0, grad_sq = 0.0;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const double value = static_cast<double>(load_param<T, C>(x.p, x.master, i));
    const double grad = static_cast<double>(static_cast<C>(to_compute(x.g[i])) * gs);
    param_sq += value * value;
    grad_sq += grad * grad;
  }
  param_sq = mta::block_reduce(param_sq, sum_combine);
  grad_sq = mta::block_reduce(grad_sq, sum_combine);
  if (threadIdx.x == 0) {
    const int64_t index = meta.partial_base[c.slot] + c.chunk;
    partials[2 * index] = param_sq;
    partials[2 * index + 1] = grad_sq;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    lars_stage2_kernel(const __grid_constant__ OptimMeta meta, OptimScalars scalars, LarsConfig config,
                       const double* partials) {
  if (skip_step(scalars.found_inf)) return;
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  double param_sq, grad_sq;
  tensor_sums(meta, c.slot, partials, param_sq, grad_sq);
  const double ratio = lars_trust_ratio(config, param_sq, grad_sq);
  LarsScalars<C> s;
  s.lr = static_cast<C>(*scalars.lr);
  s.momentum = static_cast<C>(config.has_momentum ? *scalars.momentum : 0.0);
  s.weight_decay = static_cast<C>(config.weight_decay);
  s.ratio = static_cast<C>(ratio);
  s.grad_scale = static_cast<C>(grad_scale_of(scalars));
  s.adapt = ratio != 0.0;
  s.first = *meta.steps[c.slot] <= 1;
  const OptimPointers<T> x = optim_pointers<T>(meta, c.slot, c.begin);
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    C value = load_param<T, C>(x.p, x.master, i);
    C buffer = x.s0.present() ? x.s0.get(i) : C(0);
    lars_element(value, static_cast<C>(to_compute(x.g[i])), x.s0.present() ? &buffer : nullptr, s);
    if (x.s0.present()) x.s0.set(i, buffer);
    store_param<T, C>(x.p, x.master, i, value);
  }
}

// ---------------------------------------------------------------- grad scaler
template <typename T>
__global__ void __launch_bounds__(kThreads)
    unscale_kernel(const __grid_constant__ ListMeta meta, const float* scale, float* found_inf) {
  const auto c = this_chunk(meta);
  const float inv_scale = static_cast<float>(1.0 / static_cast<double>(*scale));
  T* g = static_cast<T*>(meta.addresses[0][c.slot]) + c.begin;
  bool bad = false;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const auto value = to_compute(g[i]);
    bad |= !isfinite(value);
    g[i] = from_compute<T>(inv_scale == 1.0f ? value : value * static_cast<decltype(value)>(inv_scale));
  }
  if (bad) *found_inf = 1.0f;  // every writer stores the same value
}

struct FoundInfList {
  const float* flags[kGradScalerMaxFoundInf];
  int32_t count;
};

__global__ void scaler_update_kernel(float* scale, int32_t* growth_tracker, FoundInfList found_infs,
                                     float growth_factor, float backoff_factor, int64_t growth_interval) {
  float found = 0.0f;
  for (int i = 0; i < found_infs.count; ++i) found += *found_infs.flags[i];
  if (found != 0.0f) {
    *scale *= backoff_factor;
    *growth_tracker = 0;
    return;
  }
  const int32_t successful = *growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = *scale * growth_factor;
    if (isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = successful;
  }
}

// ---------------------------------------------------------------- clipping
__device__ inline double max_combine(double a, double b) { return norm_combine(a, b, true); }

template <typename T>
__global__ void __launch_bounds__(kThreads)
    norm_partials_kernel(const __grid_constant__ ListMeta meta, double norm_type, int mode, double* partials) {
  const auto c = this_chunk(meta);
  const T* g = static_cast<const T*>(meta.addresses[0][c.slot]) + c.begin;
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const double x = static_cast<double>(to_compute(g[i]));
    acc = norm_combine(acc, norm_element(x, norm_type, mode), mode == 2);
  }
  acc = mode == 2 ? mta::block_reduce(acc, max_combine) : mta::block_reduce(acc, sum_combine);
  if (threadIdx.x == 0) partials[meta.partial_base[c.slot] + c.chunk] = acc;
}

__global__ void __launch_bounds__(kThreads)
    norm_finish_kernel(const double* partials, int64_t count, double norm_type, int mode, double max_norm,
                       float* total_norm, float* clip_coef) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc = norm_combine(acc, partials[i], mode == 2);
  acc = mode == 2 ? mta::block_reduce(acc, max_combine) : mta::block_reduce(acc, sum_combine);
  if (threadIdx.x == 0) {
    const float total = static_cast<float>(norm_finish(acc, norm_type, mode));
    *total_norm = total;
    if (clip_coef != nullptr) *clip_coef = clip_coefficient(max_norm, total);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) grad_scale_kernel(const __grid_constant__ ListMeta meta, const float* coef) {
  const float factor = *coef;
  if (factor == 1.0f) return;
  const auto c = this_chunk(meta);
  T* g = static_cast<T*>(meta.addresses[0][c.slot]) + c.begin;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const auto value = to_compute(g[i]);
    g[i] = from_compute<T>(value * static_cast<decltype(value)>(factor));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) grad_clamp_kernel(const __grid_constant__ ListMeta meta, double clip) {
  using C = device_compute_t<T>;
  const auto c = this_chunk(meta);
  T* g = static_cast<T*>(meta.addresses[0][c.slot]) + c.begin;
  const C hi = static_cast<C>(clip), lo = -hi;
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    const C x = to_compute(g[i]);
    g[i] = from_compute<T>(x < lo ? lo : (x > hi ? hi : x));
  }
}

// ---------------------------------------------------------------- averaging
template <typename T>
__global__ void __launch_bounds__(kThreads)
    average_kernel(const __grid_constant__ PairMeta meta, AverageConfig config, const float* skip_flag) {
  if (skip_step(skip_flag)) return;
  using A = device_compute_t<T>;
  const auto c = this_chunk(meta);
  A* avg = static_cast<A*>(meta.addresses[0][c.slot]) + c.begin;
  const T* p = static_cast<const T*>(meta.addresses[1][c.slot]) + c.begin;
  const A weight = static_cast<A>(config.weight), divisor = static_cast<A>(config.divisor);
  for (int64_t i = threadIdx.x; i < c.length; i += blockDim.x) {
    avg[i] = average_element(avg[i], static_cast<A>(to_compute(p[i])), weight, divisor, config.divide);
  }
}

// ---------------------------------------------------------------- schedules
// One launch per parameter group (the first advances the step), so the
// number of groups is not bounded by what a launch's parameters can hold.
struct ScheduleTarget {
  double* lr;
  double* momentum;       // may be null
  const double* base_lr;  // may be null
};

__global__ void schedule_kernel(const __grid_constant__ ScheduleSegments program, const ScheduleGroup group,
                                ScheduleTarget target, int64_t* last_epoch, const float* found_inf, bool advance) {
  if (advance && !skip_step(found_inf)) ++*last_epoch;
  const double base = target.base_lr != nullptr ? *target.base_lr : NAN;
  const ScheduleValue value = schedule_program_value(program, group, *last_epoch, base);
  *target.lr = value.lr;
  if (value.has_momentum && target.momentum != nullptr) *target.momentum = value.momentum;
}

template <typename Fn>
void dispatch_device(DType dtype, const char* op, Fn&& fn) {
  dispatch_floating(dtype, op, [&]<typename T>() { fn.template operator()<device_t<T>>(); });
}
}  // namespace

// ---------------------------------------------------------------- entry points
void optim_step_prologue_cuda(int64_t* global_step, int64_t* const* param_steps, int64_t count,
                              const float* found_inf, cuda::Stream stream) {
  int64_t done = 0;
  do {
    StepPointers list;
    list.global = done == 0 ? global_step : nullptr;
    list.count = static_cast<int32_t>(std::min<int64_t>(count - done, kMaxStepPointers));
    for (int i = 0; i < list.count; ++i) list.steps[i] = param_steps[done + i];
    step_prologue_kernel<<<1, 256, 0, as_cuda(stream)>>>(list, found_inf);
    cuda::check_last_launch("optim_step_prologue");
    done += list.count;
  } while (done < count);
}

void sgd_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                   const SgdConfig& config, cuda::Stream stream) {
  dispatch_device(dtype, "sgd", [&]<typename T>() {
    launch_optim(tensors, count, as_cuda(stream), "sgd", sgd_kernel<T>, scalars, config);
  });
}

void adam_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const AdamConfig& config, cuda::Stream stream) {
  dispatch_device(dtype, "adam", [&]<typename T>() {
    launch_optim(tensors, count, as_cuda(stream), "adam", adam_kernel<T>, scalars, config);
  });
}

void lamb_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const LambConfig& config, double* partials, cuda::Stream stream) {
  dispatch_device(dtype, "lamb", [&]<typename T>() {
    launch_optim(tensors, count, as_cuda(stream), "lamb_stage1", lamb_stage1_kernel<T>, scalars, config, partials);
    launch_optim(tensors, count, as_cuda(stream), "lamb_stage2", lamb_stage2_kernel<T>, scalars, config,
                 static_cast<const double*>(partials));
  });
}

void lars_step_cuda(DType dtype, const OptimTensor* tensors, int64_t count, const OptimScalars& scalars,
                    const LarsConfig& config, double* partials, cuda::Stream stream) {
  dispatch_device(dtype, "lars", [&]<typename T>() {
    launch_optim(tensors, count, as_cuda(stream), "lars_stage1", lars_stage1_kernel<T>, scalars, partials);
    launch_optim(tensors, count, as_cuda(stream), "lars_stage2", lars_stage2_kernel<T>, scalars, config,
                 static_cast<const double*>(partials));
  });
}

void grad_scaler_unscale_cuda(DType dtype, const ListTensor* grads, int64_t count, const float* scale,
                              float* found_inf, cuda::Stream stream) {
  dispatch_device(dtype, "grad_scaler_unscale", [&]<typename T>() {
    launch_list(grads, count, as_cuda(stream), "grad_scaler_unscale", unscale_kernel<T>, scale, found_inf);
  });
}

void grad_scaler_update_cuda(float* scale, int32_t* growth_tracker, const float* const* found_infs, int count,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             cuda::Stream stream) {
  KILN_CHECK(count >= 1 && count <= kGradScalerMaxFoundInf, "grad_scaler_update: ", count,
             " found-inf flags (expected 1 to ", kGradScalerMaxFoundInf, ")");
  FoundInfList list;
  list.count = count;
  for (int i = 0; i < count; ++i) list.flags[i] = found_infs[i];
  scaler_update_kernel<<<1, 1, 0, as_cuda(stream)>>>(scale, growth_tracker, list, static_cast<float>(growth_factor),
                                                     static_cast<float>(backoff_factor), growth_interval);
  cuda::check_last_launch("grad_scaler_update");
}

void grad_norm_partials_cuda(DType dtype, const ListTensor* grads, int64_t count, double norm_type,
                             double* partials, cuda::Stream stream) {
  const int mode = norm_mode(norm_type);
  dispatch_device(dtype, "grad_norm", [&]<typename T>() {
    launch_list(grads, count, as_cuda(stream), "grad_norm_partials", norm_partials_kernel<T>, norm_type, mode,
                partials);
  });
}

void grad_norm_finish_cuda(const double* partials, int64_t count, double norm_type, double max_norm,
                           float* total_norm, float* clip_coef, cuda::Stream stream) {
  norm_finish_kernel<<<1, kThreads, 0, as_cuda(stream)>>>(partials, count, norm_type, norm_mode(norm_type), max_norm,
                                                          total_norm, clip_coef);
  cuda::check_last_launch("grad_norm_finish");
}

void grad_scale_cuda(DType dtype, const ListTensor* grads, int64_t count, const float* coef, cuda::Stream stream) {
  dispatch_device(dtype, "grad_scale", [&]<typename T>() {
    launch_list(grads, count, as_cuda(stream), "grad_scale", grad_scale_kernel<T>, coef);
  });
}

void grad_clamp_cuda(DType dtype, const ListTensor* grads, int64_t count, double clip_value, cuda::Stream stream) {
  dispatch_device(dtype, "clip_grad_value", [&]<typename T>() {
    launch_list(grads, count, as_cuda(stream), "clip_grad_value", grad_clamp_kernel<T>, clip_value);
  });
}

void average_update_cuda(DType param_dtype, const ListTensor* averages, const ListTensor* params, int64_t count,
                         const AverageConfig& config, const float* skip_flag, cuda::Stream stream) {
  dispatch_device(param_dtype, "average_update", [&]<typename T>() {
    launch_chunks<PairMeta>(
        count, [&](int64_t t) { return params[t].numel; },
        [&](PairMeta& meta, int slot, int64_t t) {
          meta.addresses[0][slot] = averages[t].data;
          meta.addresses[1][slot] = params[t].data;
        },
        as_cuda(stream), "average_update", average_kernel<T>, config, skip_flag);
  });
}

void schedule_step_cuda(const ScheduleProgram& program, int64_t* last_epoch, const float* found_inf, bool advance,
                        double* const* lr, double* const* momentum, const double* const* base_lr,
                        cuda::Stream stream) {
  KILN_CHECK(!program.groups.empty(), "lr schedule: a program without parameter groups");
  const ScheduleSegments& segments = program;
  for (size_t g = 0; g < program.groups.size(); ++g) {
    const ScheduleTarget target{lr[g], momentum != nullptr ? momentum[g] : nullptr,
                                base_lr != nullptr ? base_lr[g] : nullptr};
    schedule_kernel<<<1, 1, 0, as_cuda(stream)>>>(segments, program.groups[g], target, last_epoch, found_inf,
                                                  advance && g == 0);
    cuda::check_last_launch("lr_schedule_step");
  }
}

}  // namespace kiln::kernels
