// The CPU's vectorized 16-bit conversions (kernels/cpu/float_convert.h)
// against Half's and BFloat16's scalar constructors, which define kiln's
// rounding: every 16-bit pattern widened, and floats across every exponent,
// the rounding ties, subnormals, overflow and the specials narrowed.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/float_convert.h"

namespace kiln {
namespace {

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float float_of(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Floats that exercise narrowing: a random sample of all bit patterns, the
// halfway points between neighbouring bfloat16 and float16 values (ties), and
// specials. An odd count, so that the vector loops' scalar tails run too.
std::vector<float> narrowing_inputs() {
  std::vector<float> values;
  std::mt19937 engine(7);
  for (int i = 0; i < 200000; ++i) values.push_back(float_of(static_cast<uint32_t>(engine())));
  for (uint32_t upper = 0; upper < 0x10000u; upper += 7) {
    values.push_back(float_of((upper << 16) | 0x8000u));  // a bfloat16 tie
    values.push_back(float_of((upper << 16) | 0x7fffu));
  }
  for (uint32_t h = 0; h < 0x7c00u; h += 3) {
    const float value = Half::to_float(static_cast<uint16_t>(h));
    values.push_back(std::nextafter(value, 1e9f));  // just above a float16 value
    values.push_back(value + std::ldexp(1.0f, std::ilogb(value == 0 ? 1e-8f : value) - 11));  // near a float16 tie
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float special : {0.0f, -0.0f, inf, -inf, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f, -6e-8f, 3e-8f,
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
    values.push_back(special);
  }
  if (values.size() % 2 == 0) values.push_back(1.0f);
  return values;
}

}  // namespace

TEST_CASE("float_convert: widening every bfloat16 and float16 pattern equals the scalar conversion") {
  std::vector<BFloat16> bf(0x10000);
  std::vector<Half> half(0x10000);
  for (uint32_t i = 0; i < 0x10000u; ++i) {
    bf[i].bits = static_cast<uint16_t>(i);
    half[i].bits = static_cast<uint16_t>(i);
  }
  std::vector<float> wide(0x10000 + 3);
  kernels::cpu::widen_to_float(bf.data(), wide.data(), 0x10000);
  int64_t wrong = 0;
  for (uint32_t i = 0; i < 0x10000u; ++i) wrong += bits_of(wide[i]) != bits_of(static_cast<float>(bf[i]));
  CHECK(wrong == 0);
  // float16: the same bits except that the hardware quiets a signaling NaN.
  kernels::cpu::widen_to_float(half.data() + 1, wide.data(), 0x10000 - 1);  // unaligned, odd length
  wrong = 0;
  for (uint32_t i = 1; i < 0x10000u; ++i) {
    const float expected = static_cast<float>(half[i]);
    wrong += std::isnan(expected) ? !std::isnan(wide[i - 1]) : bits_of(wide[i - 1]) != bits_of(expected);
  }
  CHECK(wrong == 0);
}

TEST_CASE("float_convert: narrowing equals the scalar round-to-nearest-even, ties, subnormals and overflow included") {
  const std::vector<float> values = narrowing_inputs();
  const auto n = static_cast<int64_t>(values.size());
  std::vector<BFloat16> bf(values.size());
  std::vector<Half> half(values.size());
  kernels::cpu::narrow_from_float(values.data(), bf.data(), n);
  kernels::cpu::narrow_from_float(values.data(), half.data(), n);
  int64_t wrong_bf = 0, wrong_half = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    const BFloat16 expected_bf(values[i]);
    const Half expected_half(values[i]);
    if (std::isnan(values[i])) {  // NaN stays NaN (float16's payload may differ: see float_convert.h)
      wrong_bf += bf[i].bits != expected_bf.bits;
      wrong_half += !std::isnan(static_cast<float>(half[i]));
      continue;
    }
    wrong_bf += bf[i].bits != expected_bf.bits;
    wrong_half += half[i].bits != expected_half.bits;
  }
  CHECK(wrong_bf == 0);
  CHECK(wrong_half == 0);
}

}  // namespace kiln
