// matmul, mm, bmm, linear: values against a naive triple loop in double, every
// transpose/stride combination the GEMM is handed as flags, batch broadcasting,
// thread-count independence of the CPU GEMM, gradients against the closed
// forms, error paths, and CUDA checks (skipped visibly without a GPU).
#include <omp.h>

#include <cmath>
#include <random>

#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64) {
  return tensor<double>(random_values(shape_numel(shape), seed), shape).to(dtype);
}

// (m, k) @ (k, n) in double, from the logical values of any layout.
Tensor naive_mm(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>(), out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double total = 0;
      for (int64_t p = 0; p < k; ++p) total += x[i * k + p] * y[p * n + j];
      out[i * n + j] = total;
    }
  }
  return tensor<double>(out, {m, n});
}

Tensor naive_linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor out = naive_mm(x, w.t());
  if (!bias.defined()) return out;
  std::vector<double> values = out.to_vector<double>(), b = bias.to_vector<double>();
  for (size_t i = 0; i < values.size(); ++i) values[i] += b[i % b.size()];
  return tensor<double>(values, out.shape());
}

Tolerance value_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-12, 1e-12};
    case DType::f32: return {1e-5, 1e-5};
    case DType::f16: return {5e-3, 5e-3};
    default: return {3e-2, 3e-2};
  }
}


}  // namespace

TEST_CASE("matmul: 2-D values against a naive loop, every dtype") {
  for (DType dtype : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    INFO("dtype " << dtype_name(dtype));
    Tensor a = random_tensor({37, 53}, 1, dtype), b = random_tensor({53, 29}, 2, dtype);
    Tensor expected = naive_mm(a, b);
    Tensor out = matmul(a, b);
    CHECK(out.dtype() == dtype);
    CHECK(out.shape() == Shape{37, 29});
    Tolerance tol = value_tolerance(dtype);
    KILN_CHECK_CLOSE(out.to(DType::f64), expected, tol.rtol, tol.atol * std::sqrt(53.0));
  }
}

TEST_CASE("matmul: transposed and sliced operands reach the GEMM as flags and leading dims") {
  Tensor a_store = random_tensor({40, 60}, 3, DType::f32), b_store = random_tensor({60, 50}, 4, DType::f32);
  // op(A) (m=20, k=30), op(B) (k=30, n=25) cut from larger stores: ld > cols,
  // offsets that are not multiples of a vector width.
  Tensor a_row = a_store.narrow(0, 1, 20).narrow(1, 3, 30);        // row-major, ld 60
  Tensor a_col = a_store.t().narrow(0, 3, 20).narrow(1, 1, 30);    // column-major, ld 60
  Tensor b_row = b_store.narrow(0, 2, 30).narrow(1, 5, 25);        // row-major, ld 50
  Tensor b_col = b_store.t().narrow(0, 5, 25).narrow(1, 2, 30).t();  // column-major (transposed)
  for (const Tensor& a : {a_row, a_col}) {
    for (const Tensor& b : {b_row, b_col}) {
      Tensor expected = naive_mm(a, b);
      KILN_CHECK_CLOSE(mm(a, b).to(DType::f64), expected, 1e-5, 1e-5);
      KILN_CHECK_CLOSE(matmul(a, b).to(DType::f64), expected, 1e-5, 1e-5);
    }
  }
  // Neither row- nor column-major (a stride-2 column): copied, still right.
  Tensor a_step = a_store.slice(1, 0, 60, 2).narrow(0, 0, 20);  // (20, 30), col stride 2
  KILN_CHECK_CLOSE(mm(a_step, b_row).to(DType::f64), naive_mm(a_step, b_row), 1e-5, 1e-5);
}

TEST_CASE("matmul: torch.matmul shapes for 1-D operands and batch broadcasting") {
  Tensor v = random_tensor({4}, 5), w = random_tensor({4}, 6), m = random_tensor({3, 4}, 7),
         n = random_tensor({4, 5}, 8);
  Tensor dot = matmul(v, w);
  CHECK(dot.dim() == 0);
  double expected_dot = 0;
  for (int i = 0; i < 4; ++i) expected_dot += v.to_vector<double>()[i] * w.to_vector<double>()[i];
  CHECK(dot.item<double>() == doctest::Approx(expected_dot).epsilon(1e-12));
  CHECK(matmul(v, n).shape() == Shape{5});
  KILN_CHECK_CLOSE(matmul(v, n), naive_mm(v.reshape({1, 4}), n).reshape({5}), 1e-12, 1e-12);
  CHECK(matmul(m, v).shape() == Shape{3});
  KILN_CHECK_CLOSE(matmul(m, v), naive_mm(m, v.reshape({4, 1})).reshape({3}), 1e-12, 1e-12);

  // (2, 1, 3, 4) @ (5, 4, 6) -> (2, 5, 3, 6): every batch entry is its own product.
  Tensor a = random_tensor({2, 1, 3, 4}, 9), b = random_tensor({5, 4, 6}, 10);
  Tensor out = matmul(a, b);
  REQUIRE(out.shape() == Shape{2, 5, 3, 6});
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      KILN_CHECK_CLOSE(out.select(0, i).select(0, j), naive_mm(a.select(0, i).select(0, 0), b.select(0, j)), 1e-12,
                       1e-12);
    }
  }
  // (3, 4) @ (2, 4, 6): the 2-D operand is broadcast with a 0 batch stride.
  Tensor c = random_tensor({2, 4, 6}, 11);
  Tensor broadcast = matmul(m, c);
  REQUIRE(broadcast.shape() == Shape{2, 3, 6});
  for (int64_t i = 0; i < 2; ++i) KILN_CHECK_CLOSE(broadcast.select(0, i), naive_mm(m, c.select(0, i)), 1e-12, 1e-12);
  // (2, 3, 4) @ (4, 5): folded into one (6, 4) @ (4, 5) product.
  Tensor d = random_tensor({2, 3, 4}, 12);
  Tensor folded = matmul(d, n);
  REQUIRE(folded.shape() == Shape{2, 3, 5});
  for (int64_t i = 0; i < 2; ++i) KILN_CHECK_CLOSE(folded.select(0, i), naive_mm(d.select(0, i), n), 1e-12, 1e-12);
  // A batch that does not fold (permuted): takes the batched path, same values.
  Tensor permuted = random_tensor({3, 2, 4}, 13).permute({1, 0, 2});  // (2, 3, 4), batch stride 4
  Tensor out_permuted = matmul(permuted, n);
  for (int64_t i = 0; i < 2; ++i) {
    KILN_CHECK_CLOSE(out_permuted.select(0, i), naive_mm(permuted.select(0, i), n), 1e-12, 1e-12);
  }
  CHECK(matmul(v, random_tensor({2, 4, 3}, 14)).shape() == Shape{2, 3});
  CHECK(matmul(d, random_tensor({4}, 15)).shape() == Shape{2, 3});
}

TEST_CASE("bmm and linear against naive loops") {
  Tensor a = random_tensor({3, 7, 5}, 20), b = random_tensor({3, 5, 9}, 21);
  Tensor out = bmm(a, b);
  for (int64_t i = 0; i < 3; ++i) KILN_CHECK_CLOSE(out.select(0, i), naive_mm(a.select(0, i), b.select(0, i)), 1e-12, 1e-12);

  Tensor x = random_tensor({6, 5}, 22), w = random_tensor({4, 5}, 23), bias = random_tensor({4}, 24);
  KILN_CHECK_CLOSE(linear(x, w, bias), naive_linear(x, w, bias), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(linear(x, w), naive_linear(x, w, Tensor()), 1e-12, 1e-12);
  Tensor x3 = random_tensor({2, 3, 5}, 25);
  Tensor out3 = linear(x3, w, bias);
  REQUIRE(out3.shape() == Shape{2, 3, 4});
  KILN_CHECK_CLOSE(out3.reshape({6, 4}), naive_linear(x3.reshape({6, 5}), w, bias), 1e-12, 1e-12);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    INFO("dtype " << dtype_name(dtype));
    Tolerance tol = value_tolerance(dtype);
    KILN_CHECK_CLOSE(linear(x.to(dtype), w.to(dtype), bias.to(dtype)).to(DType::f64),
                     naive_linear(x.to(dtype), w.to(dtype), bias.to(dtype)), tol.rtol, tol.atol * 3);
  }
  // k = 0: the product is the bias (or zeros); rows = 0: an empty result.
  Tensor empty_in = zeros({3, 0}, {.dtype = DType::f64}), empty_w = zeros({4, 0}, {.dtype = DType::f64});
  KILN_CHECK_CLOSE(linear(empty_in, empty_w, bias), bias.expand({3, 4}).contiguous(), 0, 0);
  KILN_CHECK_CLOSE(linear(empty_in, empty_w), zeros({3, 4}, {.dtype = DType::f64}), 0, 0);
  CHECK(linear(zeros({0, 5}, {.dtype = DType::f64}), w, bias).shape() == Shape{0, 4});
  CHECK(matmul(zeros({0, 5}), zeros({5, 3})).shape() == Shape{0, 3});
}

TEST_CASE("matmul: the CPU GEMM gives the same bits for any thread count") {
  // Large enough to be cut into tiles of C; a deep one (k = 4096, C only
  // 64 x 288) is also cut along k, with partial products summed in order.
  Tensor a = random_tensor({300, 257}, 30, DType::f32), b = random_tensor({257, 270}, 31, DType::f32);
  Tensor xb = random_tensor({6, 64, 96}, 32, DType::f32), yb = random_tensor({6, 96, 80}, 33, DType::f32);
  Tensor deep_x = random_tensor({64, 4096}, 34, DType::f32), deep_w = random_tensor({288, 4096}, 35, DType::f32);
  Tensor deep_bias = random_tensor({288}, 36, DType::f32);
  const int threads = omp_get_max_threads();
  std::vector<Tensor> results[2];
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : std::max(threads, 2));
    results[run] = {mm(a, b), bmm(xb, yb), linear(deep_x, deep_w, deep_bias), linear(deep_x, deep_w)};
  }
  omp_set_num_threads(threads);
  for (size_t i = 0; i < results[0].size(); ++i) {
    INFO("product " << i);
    KILN_CHECK_CLOSE(results[1][i], results[0][i], 0, 0);
  }
  KILN_CHECK_CLOSE(results[0][0].to(DType::f64), naive_mm(a, b), 1e-4, 1e-4);
  KILN_CHECK_CLOSE(results[0][2].to(DType::f64), naive_linear(deep_x, deep_w, deep_bias), 1e-4, 1e-3);
  KILN_CHECK_CLOSE(results[0][3].to(DType::f64), naive_linear(deep_x, deep_w, Tensor()), 1e-4, 1e-3);
}

TEST_CASE("matmul backward: closed forms, transposed inputs and broadcast batches") {
  Tensor a = random_tensor({5, 3}, 40).requires_grad_(), b = random_tensor({4, 5}, 41).requires_grad_();
  Tensor at = a.t(), bt = b.t();  // (3, 5) @ (5, 4), both transposed views
  Tensor out = mm(at, bt);
  Tensor dout = random_tensor({3, 4}, 42);
  out.backward(dout);
  // d(at) = dout @ bt^T = dout @ b, so da = (dout @ b)^T; d(bt) = at^T @ dout = a @ dout, so db = (a @ dout)^T.
  KILN_CHECK_CLOSE(a.grad(), naive_mm(dout, b.detach()).t().contiguous(), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(b.grad(), naive_mm(a.detach(), dout).t().contiguous(), 1e-12, 1e-12);

  // A broadcast 2-D operand gets the sum of the per-batch gradients.
  Tensor m = random_tensor({3, 4}, 43).requires_grad_(), c = random_tensor({2, 4, 6}, 44);
  Tensor g = random_tensor({2, 3, 6}, 45);
  matmul(m, c).backward(g);
  Tensor expected = naive_mm(g.select(0, 0), c.select(0, 0).t());
  expected = tensor<double>(
      [&] {
        std::vector<double> first = expected.to_vector<double>();
        std::vector<double> second = naive_mm(g.select(0, 1), c.select(0, 1).t()).to_vector<double>();
        for (size_t i = 0; i < first.size(); ++i) first[i] += second[i];
        return first;
      }(),
      {3, 4});
  KILN_CHECK_CLOSE(m.grad(), expected, 1e-12, 1e-12);

  // linear: dbias is the column sum of dout, dweight = dout^T @ x.
  Tensor x = random_tensor({6, 5}, 46).requires_grad_(), w = random_tensor({4, 5}, 47).requires_grad_(),
         bias = random_tensor({4}, 48).requires_grad_();
  Tensor dy = random_tensor({6, 4}, 49);
  linear(x, w, bias).backward(dy);
  std::vector<double> dy_values = dy.to_vector<double>(), column_sums(4, 0.0);
  for (size_t i = 0; i < dy_values.size(); ++i) column_sums[i % 4] += dy_values[i];
  KILN_CHECK_CLOSE(bias.grad(), tensor<double>(column_sums, {4}), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(w.grad(), naive_mm(dy.t(), x.detach()), 1e-12, 1e-12);
  KILN_CHECK_CLOSE(x.grad(), naive_mm(dy, w.detach()), 1e-12, 1e-12);

  // Only the inputs that need a gradient get one.
  Tensor frozen = random_tensor({5, 4}, 50);
  Tensor trained = random_tensor({3, 5}, 51).requires_grad_();
  mm(trained, frozen).backward(random_tensor({3, 4}, 52));
  CHECK(trained.grad().defined());
  CHECK_FALSE(frozen.grad().defined());
}

TEST_CASE("matmul: a saved operand modified in place is reported at backward") {
  Tensor a = random_tensor({3, 4}, 60).requires_grad_(), b = random_tensor({4, 2}, 61);
  Tensor out = mm(a, b);
  {
    NoGradGuard no_grad;
    b.fill_(1.0);
  }
  CHECK_THROWS_WITH_AS(out.backward(ones({3, 2}, {.dtype = DType::f64})), doctest::Contains("modified by an in-place"),
                       Error);
}

TEST_CASE("matmul errors name the op, the shapes and what was expected") {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  CHECK(error_of([&] { matmul(a, b); }).find("matmul: the inner dimensions do not match: shapes [2, 3] and [4, 5] (3 != 4)") !=
        std::string::npos);
  CHECK(error_of([&] { mm(a, b); }).find("mm: the inner dimensions do not match") != std::string::npos);
  CHECK(error_of([&] { bmm(zeros({2, 2, 3}), zeros({2, 4, 5})); }).find("bmm: the inner dimensions") !=
        std::string::npos);
  CHECK(error_of([&] { bmm(zeros({2, 2, 3}), zeros({3, 3, 5})); }).find("bmm: the batch sizes differ") !=
        std::string::npos);
  CHECK(error_of([&] { mm(zeros({2, 3, 4}), zeros({4, 5})); }).find("mm: expected two 2-D tensors") !=
        std::string::npos);
  CHECK(error_of([&] { bmm(zeros({3, 4}), zeros({4, 5})); }).find("bmm: expected two 3-D tensors") !=
        std::string::npos);
  CHECK(error_of([&] { matmul(zeros({2, 3}), zeros({3, 4}, {.dtype = DType::f64})); })
            .find("matmul: expected both tensors to have the same dtype") != std::string::npos);
  CHECK(error_of([&] { matmul(zeros({2, 3}, {.dtype = DType::i64}), zeros({3, 4}, {.dtype = DType::i64})); })
            .find("integer products are not supported") != std::string::npos);
  CHECK(error_of([&] { matmul(scalar_tensor(2.0), zeros({3})); }).find("matmul: both arguments need at least 1 dim") !=
        std::string::npos);
  CHECK(error_of([&] { matmul(zeros({3}), scalar_tensor(2.0)); }).find("at least 1 dim") != std::string::npos);
  CHECK(error_of([&] { matmul(zeros({2, 2, 3, 4}), zeros({3, 4, 5})); }).find("cannot be broadcast") !=
        std::string::npos);
  CHECK(error_of([&] { linear(zeros({2, 3}), zeros({4, 5})); })
            .find("linear: input shape [2, 3] does not match weight shape [4, 5]") != std::string::npos);
  CHECK(error_of([&] { linear(zeros({2, 5}), zeros({4, 5}), zeros({3})); })
            .find("linear: expected a bias of shape [4]") != std::string::npos);
  CHECK(error_of([&] { linear(zeros({2, 5}), zeros({5})); }).find("linear: expected a 2-D weight") !=
        std::string::npos);
  CHECK(error_of([&] { matmul(Tensor(), zeros({3})); }).find("matmul: input is an undefined tensor") !=
        std::string::npos);
}

TEST_CASE("allow_tf32 is off by default and switchable") {
  CHECK_FALSE(allow_tf32());
  set_allow_tf32(true);
  CHECK(allow_tf32());
  set_allow_tf32(false);
  CHECK_FALSE(allow_tf32());
}

TEST_CASE("matmul on CUDA: device mismatch, alignment, bias epilogue, k = 0, TF32 [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor cpu_a = random_tensor({8, 6}, 70, DType::f32), cpu_b = random_tensor({6, 5}, 71, DType::f32);
  CHECK(error_of([&] { matmul(cpu_a, cpu_b.cuda()); }).find("matmul: expected both tensors on the same device") !=
        std::string::npos);
  // Offsets of one element: pointers aligned to 4 (float) or 2 (16-bit) bytes
  // only. The views are taken on the device (a CPU view copied to the GPU
  // would arrive aligned), so cuBLASLt's low-alignment path runs.
  const auto misaligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0; };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    INFO("dtype " << dtype_name(dtype));
    // Row lengths 40 and 26: an offset of one row and one element is 41 and 27
    // elements, a multiple of 16 bytes for no dtype here.
    Tensor a_store = random_tensor({33, 40}, 72, dtype), b_store = random_tensor({41, 26}, 73, dtype);
    Tensor a = a_store.narrow(0, 1, 31).narrow(1, 1, 39), b = b_store.narrow(0, 1, 39).narrow(1, 1, 25);
    Tensor a_gpu = a_store.cuda().narrow(0, 1, 31).narrow(1, 1, 39), b_gpu = b_store.cuda().narrow(0, 1, 39).narrow(1, 1, 25);
    REQUIRE(misaligned(a_gpu));
    REQUIRE(misaligned(b_gpu));
    Tensor expected = mm(a, b);
    Tolerance tol = parity_tolerance(dtype);
    KILN_CHECK_CLOSE(mm(a_gpu, b_gpu).cpu(), expected, std::max(tol.rtol, 2e-5), std::max(tol.atol, 2e-5));
    KILN_CHECK_CLOSE(mm(a.cuda(), b.cuda()).cpu(), expected, std::max(tol.rtol, 2e-5), std::max(tol.atol, 2e-5));
    KILN_CHECK_CLOSE(mm(a.cuda().t().contiguous().t(), b_gpu).cpu(), expected, std::max(tol.rtol, 2e-5),
                     std::max(tol.atol, 2e-5));
    // linear: bias epilogue (or the pre-filled C for float64 and unaligned bias),
    // with the bias and the input misaligned on the device.
    Tensor x = random_tensor({17, 39}, 74, dtype), w = random_tensor({25, 39}, 75, dtype),
           bias_store = random_tensor({26}, 76, dtype), x_store = random_tensor({17 * 39 + 1}, 77, dtype);
    Tensor bias = bias_store.narrow(0, 1, 25);
    Tensor bias_gpu = bias_store.cuda().narrow(0, 1, 25);
    REQUIRE(misaligned(bias_gpu));
    KILN_CHECK_CLOSE(linear(x.cuda(), w.cuda(), bias_gpu).cpu(), linear(x, w, bias), std::max(tol.rtol, 2e-5),
                     std::max(tol.atol, 2e-5));
    Tensor x_misaligned = x_store.narrow(0, 1, 17 * 39).view({17, 39});
    Tensor x_misaligned_gpu = x_store.cuda().narrow(0, 1, 17 * 39).view({17, 39});
    REQUIRE(misaligned(x_misaligned_gpu));
    KILN_CHECK_CLOSE(linear(x_misaligned_gpu, w.cuda(), bias_gpu).cpu(), linear(x_misaligned, w, bias),
                     std::max(tol.rtol, 2e-5), std::max(tol.atol, 2e-5));
    // k = 0.
    Tensor empty_x = zeros({4, 0}, {.dtype = dtype}), empty_w = zeros({3, 0}, {.dtype = dtype});
    KILN_CHECK_CLOSE(linear(empty_x.cuda(), empty_w.cuda(), bias.narrow(0, 0, 3).cuda()).cpu(),
                     bias.narrow(0, 0, 3).expand({4, 3}).contiguous(), 0, 0);
    KILN_CHECK_CLOSE(mm(empty_x.cuda(), empty_w.t().cuda()).cpu(), zeros({4, 3}, {.dtype = dtype}), 0, 0);
  }
  // TF32: float32 inputs with a 10-bit mantissa path; looser, named tolerance.
  Tensor a = random_tensor({128, 256}, 77, DType::f32), b = random_tensor({256, 64}, 78, DType::f32);
  set_allow_tf32(true);
  Tensor tf32 = mm(a.cuda(), b.cuda()).cpu();
  set_allow_tf32(false);
  KILN_CHECK_CLOSE(tf32, mm(a, b), 5e-3, 5e-2);  // TF32 tolerance: 2^-11 relative per product, k = 256
  // Same inputs, same bits (deterministic GEMM).
  KILN_CHECK_CLOSE(mm(a.cuda(), b.cuda()).cpu(), mm(a.cuda(), b.cuda()).cpu(), 0, 0);
}

}  // namespace kiln::testing
