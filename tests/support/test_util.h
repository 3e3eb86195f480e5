// Helpers shared by the tests: GPU skipping, comparison, gradcheck.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "kernels/strided.h"

namespace kiln::testing {

// A test case that needs a GPU says so in its name: "[gpu]", or "[gpuN]" when
// it needs N GPUs (the GPU kit finds them by name). It starts with
// KILN_REQUIRE_GPU() / KILN_REQUIRE_GPUS(N), which fail the case when the name
// lacks its marker or CUDA is unusable (a driver error must not read as "no
// GPU"), and skip the rest of it, visibly, when fewer GPUs are present.
#define KILN_REQUIRE_GPU() KILN_REQUIRE_GPUS(1)
#define KILN_REQUIRE_GPUS(count)                             \
  do {                                                       \
    if (!::kiln::testing::require_gpus(count)) return;       \
  } while (0)
// The check behind the macros: true when the case may go on.
bool require_gpus(int count);

// The folder holding the project's scripts/ (KILN_SOURCE_DIR when set, as the
// GPU kit sets it; else the source tree this binary was built from).
std::filesystem::path source_root();

// The message of the kiln::Error that `fn` throws, "" when it throws none, and
// "not a kiln::Error: ..." for another exception (so a substring check fails).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.message();
  } catch (const std::exception& error) {
    return std::string("not a kiln::Error: ") + error.what();
  }
  return "";
}

// `count` draws of a standard normal from a generator seeded with `seed`:
// the same values for the same seed on every platform run here.
inline std::vector<double> random_values(int64_t count, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<double> normal;
  std::vector<double> values(static_cast<size_t>(count));
  for (double& v : values) v = normal(engine);
  return values;
}

struct Tolerance {
  double rtol;
  double atol;
};

// While alive, CUDA kernels that index by FastDivmod below a size limit take
// their 64-bit-division path (as for tensors of 2^31 elements) instead.
struct Force64BitIndex {
  Force64BitIndex() { kernels::force_64bit_index_for_testing(true); }
  ~Force64BitIndex() { kernels::force_64bit_index_for_testing(false); }
  Force64BitIndex(const Force64BitIndex&) = delete;
  Force64BitIndex& operator=(const Force64BitIndex&) = delete;
};
// The parity tolerances of DESIGN.md, per dtype.
Tolerance parity_tolerance(DType dtype);

// Empty string when |actual - expected| <= atol + rtol * |expected| elementwise
// (a NaN matches a NaN and an infinity one of the same sign, shapes must
// match); otherwise a description of the
// worst element.
std::string compare(const Tensor& actual, const Tensor& expected, double rtol, double atol);
#define KILN_CHECK_CLOSE(actual, expected, rtol, atol)                                       \
  do {                                                                                       \
    std::string kiln_mismatch = ::kiln::testing::compare((actual), (expected), (rtol), (atol)); \
    CHECK_MESSAGE(kiln_mismatch.empty(), kiln_mismatch);                                     \
  } while (0)

// float64 gradcheck by central differences (eps 1e-6, atol 1e-5, rtol 1e-3):
// compares the analytic gradient of sum(fn(inputs) * w) for a random w with
// the numeric one for every element of every floating input that requires
// grad. Returns an empty string on success, else a description.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3);

// A non-contiguous tensor with the same values as `x` (its last two dims are
// stored transposed); x itself when it has fewer than 2 dims.
Tensor non_contiguous_copy(const Tensor& x);

}  // namespace kiln::testing
