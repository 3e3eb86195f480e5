// CPU random kernels: one loop iteration per Philox counter (four 32-bit
// words), in parallel over counters. Which words an element reads is fixed by
// kernels/random.h, so the thread count never changes a value.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/float_convert.h"
#include "kernels/cpu/philox_batch.h"
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

namespace {

// out[e] = keep(e) ? in[e] * factor : +0 for e < length <= kMaxLength. Float,
// Half and BFloat16 go through a float block (widen, select, round back),
// each step a vectorized loop; double directly.
template <typename T, typename Keep>
void scale_kept(const T* in, T* out, int64_t length, compute_t<T> factor, Keep keep) {
  constexpr int64_t kMaxLength = 1024;
  if constexpr (std::is_same_v<compute_t<T>, float>) {
    float values[kMaxLength];  // not zeroed: widen_to_float writes the `length` elements read below
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 does not see that write
    cpu::widen_to_float(in, values, length);
    // The select as a bit mask: GCC 12 leaves a ternary on floats scalar.
    for (int64_t e = 0; e < length; ++e) {
      uint32_t kept;
      const float product = values[e] * factor;
      std::memcpy(&kept, &product, sizeof(kept));
      kept &= 0u - static_cast<uint32_t>(keep(e));
      std::memcpy(&values[e], &kept, sizeof(kept));
    }
    cpu::narrow_from_float(values, out, length);
#pragma GCC diagnostic pop
  } else {
    for (int64_t e = 0; e < length; ++e) out[e] = keep(e) ? in[e] * factor : T(0);
  }
}

}  // namespace

void dropout_cpu(const void* x, void* out, uint8_t* mask, DType dtype, int64_t count, float p, double scale,
                 uint64_t seed, uint64_t offset) {
  // dropout_keep(word, p) is uniform_float(word) >= p, and uniform_float is
  // (word >> 8) * 2^-24 exactly: for a float p in [0, 1] that is the integer
  // test (word >> 8) >= ceil(p * 2^24), which vectorizes (p = 1 keeps nothing).
  const auto threshold = static_cast<uint32_t>(std::ceil(static_cast<double>(p) * 16777216.0));
  // Blocks of cpu::kPhiloxBatch counters (4 elements each): the words come
  // from the batched Philox, in element order.
  constexpr int64_t kBlock = 4 * cpu::kPhiloxBatch;
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  dispatch_floating(dtype, "dropout", [&]<typename T>() {
    const T* in = static_cast<const T*>(x);
    T* result = static_cast<T*>(out);
    const auto factor = static_cast<compute_t<T>>(scale);
#pragma omp parallel for if (count > (1 << 14)) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      uint32_t words[kBlock];
      cpu::philox4x32_batch(seed, offset + static_cast<uint64_t>(block) * cpu::kPhiloxBatch, words);
      const int64_t first = block * kBlock, length = std::min(kBlock, count - first);
      const uint32_t limit = threshold;  // a local: a captured reference would be reloaded every iteration
      auto keep = [&](int64_t e) { return (words[e] >> 8) >= limit; };
      scale_kept(in + first, result + first, length, factor, keep);
      if (uint8_t* block_mask = mask == nullptr ? nullptr : mask + first) {
        for (int64_t e = 0; e < length; ++e) block_mask[e] = static_cast<uint8_t>((words[e] >> 8) >= limit);
      }
    }
  });
}

void dropout_backward_cpu(const void* dout, const uint8_t* mask, void* dx, DType dtype, int64_t count,
                          double scale) {
  constexpr int64_t kBlock = 1024;
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  dispatch_floating(dtype, "dropout backward", [&]<typename T>() {
    const T* g = static_cast<const T*>(dout);
    T* result = static_cast<T*>(dx);
    const auto factor = static_cast<compute_t<T>>(scale);
#pragma omp parallel for if (count > (1 << 16)) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t first = block * kBlock, length = std::min(kBlock, count - first);
      const uint8_t* kept = mask + first;
      scale_kept(g + first, result + first, length, factor, [kept](int64_t e) { return kept[e] != 0; });
    }
  });
}

}  // namespace kiln::kernels
