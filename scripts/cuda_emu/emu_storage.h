// Typed guarded storage for the drivers that call kiln's entry points with a
// runtime DType (test_elementwise, test_scan, test_triangular, test_sort):
// elements read and written as double through kiln's own Half / BFloat16, and
// a bit-for-bit comparison in which NaN matches NaN (kiln's and CUDA's 16-bit
// conversions give NaNs different payloads) unless the got value is still the
// 0xff poison.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "emu_cuda.h"
#include "emu_test.h"
#include "kernels/dtype.h"

namespace emu_test {

inline void put(kiln::DType t, void* p, double v) {
  using kiln::DType;
  switch (t) {
    case DType::f32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case DType::f64: *static_cast<double*>(p) = v; break;
    case DType::f16: *static_cast<kiln::Half*>(p) = kiln::Half(static_cast<float>(v)); break;
    case DType::bf16: *static_cast<kiln::BFloat16*>(p) = kiln::BFloat16(static_cast<float>(v)); break;
    case DType::i32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case DType::i64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case DType::u8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case DType::b8: *static_cast<uint8_t*>(p) = v != 0; break;
  }
}

inline double get(kiln::DType t, const void* p) {
  using kiln::DType;
  switch (t) {
    case DType::f32: return *static_cast<const float*>(p);
    case DType::f64: return *static_cast<const double*>(p);
    case DType::f16: return static_cast<float>(*static_cast<const kiln::Half*>(p));
    case DType::bf16: return static_cast<float>(*static_cast<const kiln::BFloat16*>(p));
    case DType::i32: return *static_cast<const int32_t*>(p);
    case DType::i64: return static_cast<double>(*static_cast<const int64_t*>(p));
    case DType::u8: return *static_cast<const uint8_t*>(p);
    case DType::b8: return *static_cast<const uint8_t*>(p);  // a byte other than 0/1 shows as itself
  }
  return 0;
}

inline bool all_ff(const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0xff) return false;
  }
  return true;
}

// Guarded storage of `count` elements of `t`, `misalign` bytes past 16, filled with `fill` bytes.
struct Storage {
  kiln::DType dtype;
  int64_t count;
  std::unique_ptr<emu::Buffer<unsigned char>> buffer;
  Storage(kiln::DType t, int64_t n, const std::string& name, size_t misalign = 0, unsigned char fill = 0xff)
      : dtype(t), count(n),
        buffer(std::make_unique<emu::Buffer<unsigned char>>(static_cast<size_t>(n) * kiln::dtype_size(t), name,
                                                             misalign, fill)) {}
  unsigned char* at(int64_t i) const { return buffer->data + static_cast<size_t>(i) * kiln::dtype_size(dtype); }
};

// got vs want element by element, bit for bit (NaN for NaN unless got is the poison). One check;
// a FAIL line names the first wrong element.
inline void exact_storage(const std::string& label, const char* what, const Storage& got, const Storage& want) {
  ++checks;
  const size_t size = kiln::dtype_size(got.dtype);
  long bad = 0, first = -1;
  for (int64_t i = 0; i < got.count; ++i) {
    const unsigned char* g = got.at(i);
    if (std::memcmp(g, want.at(i), size) == 0) continue;
    if (std::isnan(get(got.dtype, g)) && std::isnan(get(want.dtype, want.at(i))) && !all_ff(g, size)) continue;
    if (bad++ == 0) first = static_cast<long>(i);
  }
  if (got.count != want.count || bad > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld of %ld elements differ; first at %ld: %.9g vs %.9g\n", label.c_str(), what, bad,
                static_cast<long>(got.count), first, first < 0 ? 0.0 : get(got.dtype, got.at(first)),
                first < 0 ? 0.0 : get(want.dtype, want.at(first)));
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

}  // namespace emu_test
