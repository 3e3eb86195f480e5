// rand, randn, randint, randperm and dropout: reproducibility under a seed,
// moments, ranges, dropout's mask and scaling in forward and backward, and the
// CPU/CUDA agreement the counter-based generator promises (skipped visibly
// without a GPU).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "core/generator.h"
#include "kernels/cpu/philox_batch.h"
#include "kernels/random.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {

struct Moments {
  double mean = 0, variance = 0, min = INFINITY, max = -INFINITY;
};
Moments moments(const Tensor& x) {
  std::vector<double> v = x.to_vector<double>();
  Moments m;
  for (double value : v) {
    m.mean += value;
    m.min = std::min(m.min, value);
    m.max = std::max(m.max, value);
  }
  m.mean /= static_cast<double>(v.size());
  for (double value : v) m.variance += (value - m.mean) * (value - m.mean);
  m.variance /= static_cast<double>(v.size() - 1);
  return m;
}

bool identical(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  Tensor x = a.cpu().contiguous(), y = b.cpu().contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

constexpr DType kFloating[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("rand/randn: the same seed gives the same numbers, another seed others") {
  for (DType dtype : kFloating) {
    INFO("dtype " << dtype_name(dtype));
    manual_seed(1234);
    Tensor a = rand({1001}, {.dtype = dtype}), na = randn({1001}, {.dtype = dtype});
    manual_seed(1234);
    Tensor b = rand({1001}, {.dtype = dtype}), nb = randn({1001}, {.dtype = dtype});
    CHECK(identical(a, b));
    CHECK(identical(na, nb));
    manual_seed(1235);
    CHECK_FALSE(identical(a, rand({1001}, {.dtype = dtype})));
    // Consecutive draws continue the stream: not the same numbers again.
    manual_seed(1234);
    Tensor first = rand({1001}, {.dtype = dtype});
    CHECK_FALSE(identical(first, rand({1001}, {.dtype = dtype})));
  }
}

TEST_CASE("manual_seed resets the generator state and the offset advances by the counters drawn") {
  manual_seed(99);
  CHECK(default_generator(Device::cpu()).state().seed == 99);
  CHECK(default_generator(Device::cpu()).state().offset == 0);
  (void)rand({10});  // 10 floats: 3 counters of four words
  CHECK(default_generator(Device::cpu()).state().offset == 3);
  (void)randn({5});  // 5 normals: 3 counters (two per counter)
  CHECK(default_generator(Device::cpu()).state().offset == 6);
  (void)rand({5}, {.dtype = DType::f64});  // two words per double: 3 counters
  CHECK(default_generator(Device::cpu()).state().offset == 9);
  (void)randn({5}, {.dtype = DType::f64});  // one counter per double normal
  CHECK(default_generator(Device::cpu()).state().offset == 14);
  (void)randint(0, 10, {5});  // 64 bits per integer: 3 counters
  CHECK(default_generator(Device::cpu()).state().offset == 17);
  (void)dropout(ones({9}), 0.5);  // one word per element: 3 counters
  CHECK(default_generator(Device::cpu()).state().offset == 20);
  manual_seed(99);
  CHECK(default_generator(Device::cpu()).state().offset == 0);
}

TEST_CASE("rand element i is the uniform of Philox word i (counter i / 4, lane i % 4)") {
  manual_seed(42);
  std::vector<float> values = rand({9}).to_vector<float>();
  for (uint64_t i = 0; i < 9; ++i) CHECK(values[i] == philox::uniform_float(philox::word_at(42, 0, i)));
}

TEST_CASE("rand/randn moments over 1e5 samples") {
  for (DType dtype : kFloating) {
    INFO("dtype " << dtype_name(dtype));
    manual_seed(7);
    Moments u = moments(rand({100000}, {.dtype = dtype}));
    // Uniform [0, 1): mean 1/2, variance 1/12; standard errors ~1e-3.
    CHECK(u.mean == doctest::Approx(0.5).epsilon(0.01));
    CHECK(u.variance == doctest::Approx(1.0 / 12.0).epsilon(0.02));
    CHECK(u.min >= 0.0);
    CHECK(u.max < 1.0);
    Moments n = moments(randn({100000}, {.dtype = dtype}));
    CHECK(std::abs(n.mean) < 0.015);
    CHECK(n.variance == doctest::Approx(1.0).epsilon(0.02));
    CHECK(n.min < -3.5);  // tails are there (P(min > -3.5) ~ e^-23)
    CHECK(n.max > 3.5);
  }
}

TEST_CASE("arange, randint and randperm default to int64 when only the device is given, as torch's") {
  // A designated initializer naming only the device leaves the dtype at the
  // factories' default (int64), not at TensorOptions' float32.
  const Device cpu = Device::cpu();
  CHECK(randint(0, 10, {3}, {.device = cpu}).dtype() == DType::i64);
  CHECK(randperm(5, {.device = cpu}).dtype() == DType::i64);
  CHECK(arange(5, {.device = cpu}).dtype() == DType::i64);
  CHECK(arange(0, 6, 2, {.device = cpu}).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 4});
  // A TensorOptions given instead keeps its dtype, float32 included.
  const TensorOptions half_options{.dtype = DType::f16};
  CHECK(randint(0, 10, {3}, half_options).dtype() == DType::f16);
  CHECK(randperm(5, TensorOptions{}).dtype() == DType::f32);
  CHECK(arange(4, TensorOptions{.dtype = DType::f64}).to_vector<double>() == std::vector<double>{0, 1, 2, 3});
}

TEST_CASE("randint stays in [low, high) and hits every value; randperm is a permutation") {
  manual_seed(3);
  Tensor r = randint(-3, 4, {20000});
  CHECK(r.dtype() == DType::i64);
  std::vector<int64_t> values = r.to_vector<int64_t>();
  std::vector<int> counts(7, 0);
  for (int64_t v : values) {
    REQUIRE(v >= -3);
    REQUIRE(v < 4);
    ++counts[static_cast<size_t>(v + 3)];
  }
  for (int count : counts) CHECK(count == doctest::Approx(20000.0 / 7).epsilon(0.1));
  // The full int64 range does not overflow.
  std::vector<int64_t> wide = randint(INT64_MIN, INT64_MAX, {1000}).to_vector<int64_t>();
  CHECK(std::count_if(wide.begin(), wide.end(), [](int64_t v) { return v < 0; }) > 400);
  CHECK(randint(0, 5, {3}, {.dtype = DType::i32}).dtype() == DType::i32);
  CHECK(moments(randint(0, 100, {1000}, {.dtype = DType::f32})).max < 100);

  for (int64_t n : {0, 1, 2, 1000, 1001}) {
    Tensor p = randperm(n);
    std::vector<int64_t> perm = p.to_vector<int64_t>();
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> expected(static_cast<size_t>(n));
    std::iota(expected.begin(), expected.end(), 0);
    CHECK(sorted == expected);
  }
  manual_seed(5);
  std::vector<int64_t> first = randperm(100).to_vector<int64_t>();
  manual_seed(5);
  CHECK(randperm(100).to_vector<int64_t>() == first);
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(first != identity);
}

TEST_CASE("random factory errors") {
  CHECK_THROWS_WITH_AS(rand({3}, {.dtype = DType::i64}), doctest::Contains("rand: expected a floating dtype"), Error);
  CHECK_THROWS_WITH_AS(randn({3}, {.dtype = DType::i32}), doctest::Contains("randn: expected a floating dtype"), Error);
  CHECK_THROWS_WITH_AS(randint(5, 5, {3}), doctest::Contains("randint: expected low < high, got low = 5, high = 5"),
                       Error);
  CHECK_THROWS_WITH_AS(randint(0, 300, {3}, {.dtype = DType::u8}), doctest::Contains("does not fit in uint8"), Error);
  CHECK_THROWS_WITH_AS(randint(0, 2, {3}, {.dtype = DType::b8}), doctest::Contains("bool"), Error);
  CHECK_THROWS_WITH_AS(randperm(-1), doctest::Contains("randperm: n must be non-negative"), Error);
  CHECK_THROWS_WITH_AS(randperm(300, {.dtype = DType::u8}), doctest::Contains("does not fit in uint8"), Error);
  CHECK(rand({2, 3}, {.requires_grad = true}).requires_grad());
}

TEST_CASE("dropout: zero fraction ~p, kept values scaled by 1/(1-p), backward reuses the mask") {
  for (DType dtype : kFloating) {
    INFO("dtype " << dtype_name(dtype));
    manual_seed(11);
    const double p = 0.3;
    Tensor x = full({100000}, 2.0, {.dtype = dtype}).requires_grad_();
    Tensor y = dropout(x, p);
    std::vector<double> out = y.to_vector<double>();
    int64_t zeros_count = 0;
    const double kept_value = static_cast<double>(Tensor(full({}, 2.0 / (1.0 - p), {.dtype = dtype})).item<double>());
    for (double v : out) {
      if (v == 0.0) {
        ++zeros_count;
      } else {
        REQUIRE(v == kept_value);
      }
    }
    CHECK(static_cast<double>(zeros_count) / 100000.0 == doctest::Approx(p).epsilon(0.03));
    // Backward: the gradient is 1/(1-p) exactly where the forward kept.
    y.backward(ones({100000}, {.dtype = dtype}));
    std::vector<double> grad = x.grad().to_vector<double>();
    const double grad_value = Tensor(full({}, 1.0 / (1.0 - p), {.dtype = dtype})).item<double>();
    int64_t mismatches = 0;
    for (size_t i = 0; i < grad.size(); ++i) mismatches += (out[i] == 0.0) ? grad[i] != 0.0 : grad[i] != grad_value;
    CHECK(mismatches == 0);
  }
}

TEST_CASE("the batched CPU Philox gives philox4x32's words, across a carry into the counter's high word") {
  for (uint64_t first : {uint64_t{0}, uint64_t{0xFFFFFFFFull - 5}, uint64_t{123456789012345ull}}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{0xDEADBEEFCAFEF00Dull}}) {
      uint32_t words[4 * kernels::cpu::kPhiloxBatch];
      kernels::cpu::philox4x32_batch(seed, first, words);
      for (int c = 0; c < kernels::cpu::kPhiloxBatch; ++c) {
        const philox::Uint4 expected = philox::philox4x32(seed, first + static_cast<uint64_t>(c));
        INFO("first " << first << " seed " << seed << " counter " << c);
        CHECK(words[4 * c] == expected.x);
        CHECK(words[4 * c + 1] == expected.y);
        CHECK(words[4 * c + 2] == expected.z);
        CHECK(words[4 * c + 3] == expected.w);
      }
    }
  }
}

TEST_CASE("dropout element i is kept exactly when dropout_keep(Philox word i, p), in every dtype") {
  // The CPU kernel tests (word >> 8) >= ceil(p * 2^24) on batched words: the
  // same decision as the scalar definition, at any offset (one across 2^32
  // counters here) and for a length that is not a multiple of the batch.
  const int64_t n = 1000 + 3;
  for (DType dtype : kFloating) {
    for (double p : {0.1, 0.5, 1.0 / 3.0, 1e-7}) {
      INFO(dtype_name(dtype) << " p " << p);
      const GeneratorState state{.seed = 77, .offset = 0xFFFFFFFFull - 40};
      default_generator(Device::cpu()).set_state(state);
      Tensor x = full({n}, 3.0, {.dtype = dtype}).requires_grad_();
      const std::vector<double> out = dropout(x, p).to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = kernels::dropout_keep(philox::word_at(state.seed, state.offset, static_cast<uint64_t>(i)),
                                                static_cast<float>(p));
        wrong += keep != (out[static_cast<size_t>(i)] != 0.0);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("dropout: p = 0, eval and p = 1; errors") {
  Tensor x = randn({4, 5}).requires_grad_();
  CHECK(dropout(x, 0.0).same(x));
  CHECK(dropout(x, 0.7, /*training=*/false).same(x));
  const uint64_t before = default_generator(Device::cpu()).state().offset;
  Tensor dropped = dropout(x, 1.0);
  CHECK(default_generator(Device::cpu()).state().offset == before);  // nothing drawn
  KILN_CHECK_CLOSE(dropped, zeros({4, 5}), 0, 0);
  dropped.backward(ones({4, 5}));
  KILN_CHECK_CLOSE(x.grad(), zeros({4, 5}), 0, 0);
  // A non-contiguous input: the mask follows logical element order.
  manual_seed(21);
  Tensor base = randn({6, 7});
  manual_seed(22);
  Tensor from_transposed = dropout(base.t(), 0.5);
  manual_seed(22);
  Tensor from_copy = dropout(base.t().contiguous(), 0.5);
  CHECK(identical(from_transposed, from_copy));
  CHECK_THROWS_WITH_AS(dropout(x, 1.5), doctest::Contains("dropout: probability p must be in [0, 1], got 1.5"), Error);
  CHECK_THROWS_WITH_AS(dropout(x, -0.1), doctest::Contains("must be in [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(dropout(x, NAN), doctest::Contains("must be in [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(dropout(ones({3}, {.dtype = DType::i64}), 0.5), doctest::Contains("dropout: expected a floating"),
                       Error);
}

TEST_CASE("random: CPU and CUDA give identical numbers for the same seed [gpu]") {
  KILN_REQUIRE_GPU();
  for (DType dtype : kFloating) {
    INFO("dtype " << dtype_name(dtype));
    const int64_t n = 100003;  // not a multiple of 4 or of a block
    manual_seed(77);
    Tensor cpu_u = rand({n}, {.dtype = dtype}), cpu_n = randn({n}, {.dtype = dtype});
    Tensor cpu_i = randint(-50, 50, {n}), cpu_p = randperm(1000);
    Tensor x = randn({n}, {.dtype = dtype});
    Tensor cpu_d = dropout(x, 0.25);
    // manual_seed reseeds every device's generator: keep the CPU's offset now.
    const uint64_t cpu_offset = default_generator(Device::cpu()).state().offset;
    manual_seed(77);
    const Device gpu = Device::cuda(0);
    Tensor gpu_u = rand({n}, {.dtype = dtype, .device = gpu}), gpu_n = randn({n}, {.dtype = dtype, .device = gpu});
    Tensor gpu_i = randint(-50, 50, {n}, {.dtype = DType::i64, .device = gpu});
    Tensor gpu_p = randperm(1000, {.dtype = DType::i64, .device = gpu});
    (void)randn({n}, {.dtype = dtype, .device = gpu});  // the CPU drew x here
    Tensor gpu_d = dropout(x.cuda(), 0.25);
    CHECK(identical(cpu_u, gpu_u));
    CHECK(identical(cpu_i, gpu_i));
    CHECK(identical(cpu_p, gpu_p));
    CHECK(identical(cpu_d, gpu_d));  // same mask, same scaling
    // The generators advanced alike.
    CHECK(cpu_offset > 0);
    CHECK(cpu_offset == default_generator(gpu).state().offset);
    // randn goes through log/cos: CUDA's and glibc's differ in the last bits of
    // a double, which changes a float result only at a rounding boundary.
    std::vector<double> a = cpu_n.to_vector<double>(), b = gpu_n.cpu().to_vector<double>();
    const double rtol = dtype == DType::f64 ? 1e-13 : dtype == DType::f32 ? 1e-6 : dtype == DType::f16 ? 1e-3 : 1e-2;
    int64_t differing = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] != b[i]) {
        ++differing;
        CHECK(std::abs(a[i] - b[i]) <= rtol * std::abs(a[i]));
      }
    }
    if (dtype != DType::f64) CHECK(differing <= 2);
    MESSAGE("randn " << dtype_name(dtype) << ": " << differing << " of " << n << " elements differ from the CPU");
  }
}

TEST_CASE("dropout: CUDA forward and backward equal the CPU's, on aligned and offset views [gpu]") {
  KILN_REQUIRE_GPU();
  // The CUDA kernels move whole quads (one Philox counter's four elements)
  // as vectors when the pointers allow, and element by element otherwise:
  // a view one element in takes the second path.
  for (DType dtype : kFloating) {
    for (int64_t skip : {0, 1}) {
      INFO("dtype " << dtype_name(dtype) << ", view offset " << skip);
      const int64_t n = 4099;
      manual_seed(5);
      const Tensor base = randn({n + skip}, {.dtype = dtype});
      const Tensor dy = randn({n}, {.dtype = dtype});
      auto run = [&](Device device) {
        manual_seed(21);
        Tensor x = base.to(device).narrow(0, skip, n).detach();
        x.requires_grad_();
        Tensor y = dropout(x, 0.3);
        y.backward(dy.to(device));
        return std::pair{y.detach().cpu(), x.grad().cpu()};
      };
      const auto [cpu_y, cpu_dx] = run(Device::cpu());
      const auto [gpu_y, gpu_dx] = run(Device::cuda(0));
      CHECK(identical(cpu_y, gpu_y));
      CHECK(identical(cpu_dx, gpu_dx));
    }
  }
}

}  // namespace kiln::testing
