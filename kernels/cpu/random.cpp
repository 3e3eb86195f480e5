// CPU random kernels: one loop iteration per Philox counter (four 32-bit
// words), in parallel over counters. Which words an element reads is fixed by
// kernels/random.h, so the thread count never changes a value.
#include <algorithm>
#include <numeric>
#include <vector>

#include "kernels/random.h"

namespace kiln::kernels {

namespace {

uint64_t ceil_div(int64_t count, int64_t per_counter) {
  return static_cast<uint64_t>((count + per_counter - 1) / per_counter);
}

// fn(counter index, its four words) for every counter of a draw.
template <typename Fn>
void for_each_counter(uint64_t counters, uint64_t seed, uint64_t offset, Fn fn) {
  const auto n = static_cast<int64_t>(counters);
#pragma omp parallel for if (n > (1 << 12)) schedule(static)
  for (int64_t c = 0; c < n; ++c) fn(c, philox::philox4x32(seed, offset + static_cast<uint64_t>(c)));
}

}  // namespace

uint64_t uniform_counters(DType dtype, int64_t count) { return ceil_div(count, dtype == DType::f64 ? 2 : 4); }
uint64_t normal_counters(DType dtype, int64_t count) { return ceil_div(count, dtype == DType::f64 ? 1 : 2); }
uint64_t randint_counters(int64_t count) { return ceil_div(count, 2); }
uint64_t dropout_counters(int64_t count) { return ceil_div(count, 4); }

void uniform_cpu(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset) {
  if (dtype == DType::f64) {
    auto* values = static_cast<double*>(out);
    for_each_counter(uniform_counters(dtype, count), seed, offset, [&](int64_t c, const philox::Uint4& w) {
      const int64_t i = 2 * c;
      values[i] = philox::uniform_double(w.x, w.y);
      if (i + 1 < count) values[i + 1] = philox::uniform_double(w.z, w.w);
    });
    return;
  }
  dispatch_floating(dtype, "rand", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      T* values = static_cast<T*>(out);
      for_each_counter(uniform_counters(dtype, count), seed, offset, [&](int64_t c, const philox::Uint4& w) {
        for (int lane = 0; lane < 4 && 4 * c + lane < count; ++lane) {
          values[4 * c + lane] = uniform_value<T>(philox::lane(w, lane));
        }
      });
    }
  });
}

void normal_cpu(void* out, DType dtype, int64_t count, uint64_t seed, uint64_t offset) {
  if (dtype == DType::f64) {
    auto* values = static_cast<double*>(out);
    for_each_counter(normal_counters(dtype, count), seed, offset,
                     [&](int64_t c, const philox::Uint4& w) { values[c] = normal_double(w); });
    return;
  }
  dispatch_floating(dtype, "randn", [&]<typename T>() {
    if constexpr (!std::is_same_v<T, double>) {
      T* values = static_cast<T*>(out);
      for_each_counter(normal_counters(dtype, count), seed, offset, [&](int64_t c, const philox::Uint4& w) {
        values[2 * c] = normal_value<T>(w.x, w.y);
        if (2 * c + 1 < count) values[2 * c + 1] = normal_value<T>(w.z, w.w);
      });
    }
  });
}

void randint_cpu(void* out, DType dtype, int64_t count, int64_t low, uint64_t range, uint64_t seed,
                 uint64_t offset) {
  KILN_CHECK(dtype != DType::b8, "randint: bool is not a supported dtype");
  dispatch_all(dtype, "randint", [&]<typename T>() {
    T* values = static_cast<T*>(out);
    for_each_counter(randint_counters(count), seed, offset, [&](int64_t c, const philox::Uint4& w) {
      values[2 * c] = static_cast<T>(static_cast<compute_t<T>>(randint_value(w.x, w.y, low, range)));
      if (2 * c + 1 < count) {
        values[2 * c + 1] = static_cast<T>(static_cast<compute_t<T>>(randint_value(w.z, w.w, low, range)));
      }
    });
  });
}

void randperm_cpu(int64_t* out, int64_t n, uint64_t seed, uint64_t offset) {
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  for_each_counter(randint_counters(n), seed, offset, [&](int64_t c, const philox::Uint4& w) {
    keys[2 * c] = (static_cast<uint64_t>(w.x) << 32) | w.y;
    if (2 * c + 1 < n) keys[2 * c + 1] = (static_cast<uint64_t>(w.z) << 32) | w.w;
  });
  std::iota(out, out + n, int64_t{0});
  std::sort(out, out + n, [&](int64_t a, int64_t b) { return keys[a] != keys[b] ? keys[a] < keys[b] : a < b; });
}

void dropout_cpu(const void* x, void* out, uint8_t* mask, DType dtype, int64_t count, float p, double scale,
                 uint64_t seed, uint64_t offset) {
  dispatch_floating(dtype, "dropout", [&]<typename T>() {
    using C = compute_t<T>;
    const T* in = static_cast<const T*>(x);
    T* result = static_cast<T*>(out);
    const C factor = static_cast<C>(scale);
    for_each_counter(dropout_counters(count), seed, offset, [&](int64_t c, const philox::Uint4& w) {
      for (int lane = 0; lane < 4 && 4 * c + lane < count; ++lane) {
        const int64_t i = 4 * c + lane;
        const bool keep = dropout_keep(philox::lane(w, lane), p);
        result[i] = keep ? T(static_cast<C>(in[i]) * factor) : T(C(0));
        if (mask != nullptr) mask[i] = keep ? 1 : 0;
      }
    });
  });
}

void dropout_backward_cpu(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count,
                          double scale) {
  dispatch_floating(dtype, "dropout backward", [&]<typename T>() {
    using C = compute_t<T>;
    const T* g = static_cast<const T*>(dout);
    T* result = static_cast<T*>(dx);
    const C factor = static_cast<C>(scale);
#pragma omp parallel for if (count > (1 << 16)) schedule(static)
    for (int64_t i = 0; i < count; ++i) result[i] = mask[i] ? T(static_cast<C>(g[i]) * factor) : T(C(0));
  });
}

}  // namespace kiln::kernels
