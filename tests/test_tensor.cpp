// Tensor metadata, views, factories, dtype conversion, printing and error
// messages (core/tensor.cpp). Views are checked by shape, strides and offset,
// and by writing through them: a view that does not share storage fails.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/allocator.h"
#include "core/extent.h"
#include "core/tensor.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/test_util.h"

namespace kiln {
namespace {

using doctest::Contains;

// 0, 1, ..., n-1 as float32 in `shape`, built without any op family.
Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  std::iota(values.begin(), values.end(), 0.0);
  return tensor<double>(values, shape, {.dtype = dtype});
}

std::vector<float> floats(const Tensor& t) { return t.to_vector<float>(); }

bool same_storage(const Tensor& a, const Tensor& b) { return a.storage().get() == b.storage().get(); }

}  // namespace

TEST_CASE("tensor: metadata of a new tensor") {
  Tensor x = empty({2, 3, 4});
  CHECK(x.defined());
  CHECK(x.shape() == Shape{2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  CHECK(x.offset() == 0);
  CHECK(x.dim() == 3);
  CHECK(x.numel() == 24);
  CHECK(x.size(-1) == 4);
  CHECK(x.stride(0) == 12);
  CHECK(x.dtype() == DType::f32);
  CHECK(x.device() == Device::cpu());
  CHECK(x.element_size() == 4);
  CHECK(x.nbytes() == 96);
  CHECK(x.is_contiguous());
  CHECK_FALSE(x.requires_grad());
  CHECK_FALSE(x.is_pinned());
  CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 64 == 0);
  Tensor scalar = scalar_tensor(2.5);
  CHECK(scalar.dim() == 0);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.item<float>() == 2.5f);
}

TEST_CASE("tensor: view, incl. -1 and incompatible strides") {
  Tensor x = iota({2, 3, 4});
  Tensor v = x.view({4, -1});
  CHECK(v.shape() == Shape{4, 6});
  CHECK(v.strides() == Shape{6, 1});
  CHECK(same_storage(v, x));
  CHECK(x.view({-1}).shape() == Shape{24});
  CHECK(x.view({2, 1, 3, 4}).strides()[2] == 4);

  CHECK_THROWS_WITH_AS(x.view({-1, -1}), Contains("only one dimension can be -1"), Error);
  CHECK_THROWS_WITH_AS(x.view({5, 5}), Contains("invalid for 24 elements"), Error);
  CHECK_THROWS_WITH_AS(x.view({5, -1}), Contains("invalid for 24 elements"), Error);
  Tensor transposed = x.transpose(1, 2);  // (2, 4, 3), strides (12, 1, 4)
  CHECK_THROWS_WITH_AS(transposed.view({-1}), Contains("not compatible with the strides"), Error);
  CHECK_THROWS_WITH_AS(transposed.view({-1}), Contains("use reshape()"), Error);
  // Splitting a dim of a non-contiguous tensor is still a view.
  Tensor split = transposed.view({2, 2, 2, 3});
  CHECK(split.strides() == Shape{12, 2, 1, 4});
  CHECK(same_storage(split, x));
}

TEST_CASE("tensor: reshape is a view when possible and copies otherwise") {
  Tensor x = iota({2, 3, 4});
  Tensor r = x.reshape({6, 4});
  CHECK(same_storage(r, x));
  Tensor transposed = x.transpose(1, 2);
  Tensor copied = transposed.reshape({24});
  CHECK_FALSE(same_storage(copied, x));
  CHECK(copied.is_contiguous());
  std::vector<float> expected;
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 4; ++j)
      for (int i = 0; i < 3; ++i) expected.push_back(static_cast<float>(b * 12 + i * 4 + j));
  CHECK(floats(copied) == expected);
  CHECK_THROWS_WITH_AS(x.reshape({7, -1}), Contains("reshape"), Error);
}

TEST_CASE("tensor: permute, transpose, t") {
  Tensor x = iota({2, 3, 4});
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK_FALSE(p.is_contiguous());
  CHECK(same_storage(p, x));
  CHECK(x.permute({-1, 0, 1}).shape() == Shape{4, 2, 3});
  CHECK_THROWS_WITH_AS(x.permute({0, 0, 1}), Contains("repeated"), Error);
  CHECK_THROWS_WITH_AS(x.permute({0, 1}), Contains("permute: got 2 dims for a tensor with 3"), Error);

  Tensor tr = x.transpose(0, 2);
  CHECK(tr.shape() == Shape{4, 3, 2});
  CHECK(tr.strides() == Shape{1, 4, 12});
  CHECK(floats(tr.select(0, 1).select(0, 2)) == std::vector<float>{9, 21});
  CHECK_THROWS_WITH_AS(x.transpose(0, 3), Contains("transpose: dim 3 is out of range"), Error);

  Tensor m = iota({3, 4});
  Tensor mt = m.t();
  CHECK(mt.shape() == Shape{4, 3});
  CHECK(mt.strides() == Shape{1, 4});
  CHECK(floats(mt.contiguous()) == std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  CHECK(iota({5}).t().shape() == Shape{5});
  CHECK_THROWS_WITH_AS(x.t(), Contains("t(): expected a tensor with at most 2 dims"), Error);
}

TEST_CASE("tensor: narrow, slice with step, select") {
  Tensor x = iota({2, 3, 4});
  Tensor n = x.narrow(1, 1, 2);
  CHECK(n.shape() == Shape{2, 2, 4});
  CHECK(n.strides() == Shape{12, 4, 1});
  CHECK(n.offset() == 4);
  CHECK(floats(n.select(0, 0)) == std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(x.narrow(-1, -2, 2).offset() == 2);
  CHECK_THROWS_WITH_AS(x.narrow(1, 2, 2), Contains("narrow: start 2 and length 2 are out of range"), Error);

  Tensor s = x.slice(2, 1, 4, 2);
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK(s.strides() == Shape{12, 4, 2});
  CHECK(s.offset() == 1);
  CHECK(floats(s.select(0, 1).select(0, 0)) == std::vector<float>{13, 15});
  CHECK(x.slice(2, 0, 4, 3).shape()[2] == 2);     // elements 0 and 3
  CHECK(x.slice(1, 1, -1).shape() == Shape{2, 1, 4});
  CHECK(x.slice(1, 5, 10).shape() == Shape{2, 0, 4});  // clamped: empty
  CHECK_THROWS_WITH_AS(x.slice(2, 0, 4, 0), Contains("slice: step must be positive"), Error);

  Tensor sel = x.select(1, 2);
  CHECK(sel.shape() == Shape{2, 4});
  CHECK(sel.strides() == Shape{12, 1});
  CHECK(sel.offset() == 8);
  CHECK(x.select(1, -1).offset() == 8);
  CHECK(floats(sel) == std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK_THROWS_WITH_AS(x.select(1, 3), Contains("select: index 3 is out of range for dim 1 of size 3"), Error);
}

TEST_CASE("tensor: expand, incl. errors") {
  Tensor column = iota({3, 1});
  Tensor e = column.expand({2, 3, 4});
  CHECK(e.shape() == Shape{2, 3, 4});
  CHECK(e.strides() == Shape{0, 1, 0});
  CHECK(same_storage(e, column));
  CHECK(floats(e.select(0, 1).select(0, 2)) == std::vector<float>{2, 2, 2, 2});
  CHECK(column.expand({-1, 5}).shape() == Shape{3, 5});
  CHECK_THROWS_WITH_AS(column.expand({2, 4}), Contains("expand: cannot expand shape [3, 1] to [2, 4]"), Error);
  CHECK_THROWS_WITH_AS(column.expand({4}), Contains("expand: cannot expand"), Error);
}

TEST_CASE("tensor: squeeze, unsqueeze, flatten") {
  Tensor x = iota({1, 3, 1});
  CHECK(x.squeeze().shape() == Shape{3});
  CHECK(x.squeeze(0).shape() == Shape{3, 1});
  CHECK(x.squeeze(-1).shape() == Shape{1, 3});
  CHECK(x.squeeze(1).shape() == Shape{1, 3, 1});  // size 3: unchanged
  CHECK(same_storage(x.squeeze(), x));
  Tensor v = iota({3});
  CHECK(v.unsqueeze(0).shape() == Shape{1, 3});
  CHECK(v.unsqueeze(-1).shape() == Shape{3, 1});
  CHECK(v.unsqueeze(1).strides()[0] == 1);
  CHECK_THROWS_WITH_AS(v.unsqueeze(3), Contains("unsqueeze: dim 3 is out of range"), Error);

  Tensor y = iota({2, 3, 4});
  CHECK(y.flatten().shape() == Shape{24});
  CHECK(y.flatten(1).shape() == Shape{2, 12});
  CHECK(y.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(same_storage(y.flatten(), y));
  Tensor flat_t = y.transpose(0, 2).flatten();  // non-contiguous: copies
  CHECK_FALSE(same_storage(flat_t, y));
  CHECK(floats(flat_t)[1] == 12.0f);
  CHECK(scalar_tensor(1.0).flatten().shape() == Shape{1});
  CHECK_THROWS_WITH_AS(y.flatten(2, 1), Contains("flatten: start_dim 2 comes after end_dim 1"), Error);
}

TEST_CASE("tensor: a write through a view is visible in the base") {
  Tensor x = zeros({2, 3, 4});
  x.select(0, 1).fill_(7.0);
  x.slice(2, 0, 4, 2).select(0, 0).fill_(3.0);  // non-contiguous view
  x.transpose(0, 2).select(0, 3).select(0, 2).fill_(-1.0);  // x[:, 2, 3]
  std::vector<float> values = floats(x);
  for (int b = 0; b < 2; ++b) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 4; ++j) {
        float expected = b == 1 ? 7.0f : (j % 2 == 0 ? 3.0f : 0.0f);
        if (i == 2 && j == 3) expected = -1.0f;
        CHECK(values[b * 12 + i * 4 + j] == expected);
      }
    }
  }
  // Through the data pointer of a view.
  Tensor row = x.select(0, 0).select(0, 1);
  row.data<float>()[1] = 42.0f;
  CHECK(floats(x)[5] == 42.0f);
  // Every in-place write bumps the shared version counter.
  const uint64_t before = x.version();
  row.fill_(1.0);
  CHECK(x.version() == before + 1);
}

TEST_CASE("tensor: contiguous and clone") {
  Tensor x = iota({2, 3});
  CHECK(x.contiguous().same(x));
  Tensor t = x.t();
  Tensor c = t.contiguous();
  CHECK_FALSE(c.same(t));
  CHECK(c.is_contiguous());
  CHECK(c.strides() == Shape{2, 1});
  CHECK(floats(c) == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor k = x.clone();
  CHECK_FALSE(same_storage(k, x));
  CHECK(floats(k) == floats(x));
  k.fill_(9.0);
  CHECK(floats(x)[0] == 0.0f);
  CHECK(t.clone().shape() == Shape{3, 2});
}

TEST_CASE("tensor: factories") {
  CHECK(floats(zeros({3})) == std::vector<float>{0, 0, 0});
  CHECK(floats(ones({2, 2})) == std::vector<float>{1, 1, 1, 1});
  Tensor f = full({2}, 3.5, {.dtype = DType::f64});
  CHECK(f.dtype() == DType::f64);
  CHECK(f.to_vector<double>() == std::vector<double>{3.5, 3.5});
  CHECK(zeros({0, 4}).numel() == 0);
  CHECK(full_like(f, -2.0).to_vector<double>() == std::vector<double>{-2, -2});
  Tensor req = ones({2}, TensorOptions{}.with_requires_grad());
  CHECK(req.requires_grad());
  CHECK(req.is_leaf());
  CHECK_THROWS_WITH_AS(zeros({2}, {.dtype = DType::i64, .requires_grad = true}),
                       Contains("only floating tensors can require grad"), Error);

  SUBCASE("arange") {
    Tensor a = arange(5);
    CHECK(a.dtype() == DType::i64);
    CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
    CHECK(arange(5, 0, -2).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});
    Tensor quarter = arange(0, 1, 0.25, {.dtype = DType::f32});
    CHECK(floats(quarter) == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
    CHECK(arange(0, 1, 0.1, {.dtype = DType::f64}).numel() == 10);
    CHECK(arange(0, 0.3, 0.1, {.dtype = DType::f64}).numel() == 3);
    CHECK(arange(2, 2).numel() == 0);
    CHECK_THROWS_WITH_AS(arange(1, 0, 1), Contains("sign of step"), Error);
    CHECK_THROWS_WITH_AS(arange(0, 5, 0), Contains("step must be nonzero"), Error);
  }
  SUBCASE("linspace has exact endpoints") {
    CHECK(linspace(0, 1, 5).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1});
    for (int64_t steps : {2, 3, 7, 100}) {
      std::vector<double> v = linspace(-1.3, 2.7, steps, {.dtype = DType::f64}).to_vector<double>();
      REQUIRE(v.size() == static_cast<size_t>(steps));
      CHECK(v.front() == -1.3);
      CHECK(v.back() == 2.7);
    }
    CHECK(linspace(0.1, 0.7, 3, {.dtype = DType::f64}).to_vector<double>().back() == 0.7);
    CHECK(linspace(3, 4, 1).to_vector<float>() == std::vector<float>{3});
    CHECK(linspace(3, 4, 0).numel() == 0);
    CHECK_THROWS_WITH_AS(linspace(0, 1, -1), Contains("steps must be non-negative"), Error);
  }
  SUBCASE("from_blob does not copy, and runs its deleter") {
    std::vector<float> buffer = {1, 2, 3, 4, 5, 6};
    Tensor b = from_blob(buffer.data(), {2, 3}, DType::f32);
    CHECK(b.data_ptr() == buffer.data());
    buffer[4] = 50;
    CHECK(floats(b)[4] == 50.0f);
    b.select(0, 0).fill_(0.0);
    CHECK(buffer[0] == 0.0f);
    CHECK_FALSE(b.is_pinned());

    int deleted = 0;
    void* seen = nullptr;
    float* owned = new float[4]{1, 2, 3, 4};
    {
      Tensor o = from_blob(owned, {4}, DType::f32, Device::cpu(), [&](void* p) {
        ++deleted;
        seen = p;
        delete[] static_cast<float*>(p);
      });
      Tensor view = o.narrow(0, 1, 2);
      o = Tensor();
      CHECK(deleted == 0);  // the view keeps the storage alive
      CHECK(floats(view) == std::vector<float>{2, 3});
    }
    CHECK(deleted == 1);
    CHECK(seen == owned);
    CHECK_THROWS_WITH_AS(from_blob(nullptr, {2}, DType::f32), Contains("from_blob: null data"), Error);
  }
  SUBCASE("tensor<T>()") {
    Tensor i = tensor<int64_t>({1, 2, 3}, {3});
    CHECK(i.dtype() == DType::i64);
    CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
    Tensor d = tensor<float>({1.5f, 2.5f}, {2, 1}, {.dtype = DType::f64});
    CHECK(d.dtype() == DType::f64);
    CHECK(d.shape() == Shape{2, 1});
    CHECK(d.to_vector<double>() == std::vector<double>{1.5, 2.5});
    CHECK(tensor<uint8_t>({255}, {}).item<int64_t>() == 255);
    CHECK_THROWS_WITH_AS(tensor<float>({1, 2, 3}, {2, 2}), Contains("3 values for shape [2, 2]"), Error);
  }
}

TEST_CASE("tensor: to(dtype) round trips and 16-bit rounding") {
  const float inf = std::numeric_limits<float>::infinity();
  SUBCASE("f32 -> f64 -> f32 is exact") {
    std::vector<float> values = {1.0f / 3.0f, -0.0f, 1e-30f, 3.4e38f, -7.25f};
    Tensor x = tensor<float>(values, {5});
    Tensor back = x.to(DType::f64).to(DType::f32);
    CHECK(back.dtype() == DType::f32);
    CHECK(floats(back) == values);
    CHECK(x.to(DType::f32).same(x));  // no-op conversion returns the tensor itself
  }
  SUBCASE("float16") {
    Tensor x = tensor<double>({1.0 / 3.0, 65504.0, 65519.0, 65520.0, -65520.0, 0.1}, {6});
    std::vector<float> h = floats(x.to(DType::f16));
    CHECK(h[0] == 0.333251953125f);
    CHECK(h[1] == 65504.0f);  // largest half
    CHECK(h[2] == 65504.0f);  // rounds down
    CHECK(h[3] == inf);       // ties to even -> overflow
    CHECK(h[4] == -inf);
    CHECK(h[5] == 0.0999755859375f);
    // Subnormals: 2^-24 is the smallest; 2^-25 is a tie that rounds to even (0); 1.5 * 2^-25 rounds up.
    Tensor tiny = tensor<double>({std::ldexp(1.0, -24), std::ldexp(1.0, -25), 1.5 * std::ldexp(1.0, -25),
                                  std::ldexp(1.0, -14), std::ldexp(3.0, -20)},
                                 {5});
    std::vector<float> t = floats(tiny.to(DType::f16));
    CHECK(t[0] == std::ldexp(1.0f, -24));
    CHECK(t[1] == 0.0f);
    CHECK(t[2] == std::ldexp(1.0f, -24));
    CHECK(t[3] == std::ldexp(1.0f, -14));  // smallest normal
    CHECK(t[4] == std::ldexp(3.0f, -20));  // subnormal, exact
    Tensor special = tensor<float>({std::nanf(""), inf, -inf, -0.0f}, {4});
    std::vector<float> s = floats(special.to(DType::f16));
    CHECK(std::isnan(s[0]));
    CHECK(s[1] == inf);
    CHECK(s[2] == -inf);
    CHECK(s[3] == 0.0f);
    CHECK(std::signbit(s[3]));
    // Raw bits, read back through data<Half>().
    CHECK(tensor<float>({1.0f}, {1}).to(DType::f16).data<Half>()[0].bits == 0x3c00);
  }
  SUBCASE("bfloat16") {
    Tensor x = tensor<double>({1.0 / 3.0, 65520.0, 1.00390625, 1.01171875, 0.1, 3.4028234663852886e38}, {6});
    std::vector<float> b = floats(x.to(DType::bf16));
    CHECK(b[0] == 0.333984375f);
    CHECK(b[1] == 65536.0f);
    CHECK(b[2] == 1.0f);        // tie -> even
    CHECK(b[3] == 1.015625f);   // tie -> even (up)
    CHECK(b[4] == 0.10009765625f);
    CHECK(b[5] == inf);         // FLT_MAX rounds up to inf
    std::vector<float> n = floats(tensor<float>({std::nanf(""), -inf}, {2}).to(DType::bf16));
    CHECK(std::isnan(n[0]));
    CHECK(n[1] == -inf);
  }
  SUBCASE("integers and bool") {
    Tensor x = tensor<float>({2.7f, -2.7f, 0.0f, 0.5f}, {4});
    CHECK(x.to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{2, -2, 0, 0});  // truncation
    CHECK(x.to(DType::b8).to_vector<bool>() == std::vector<bool>{true, true, false, true});
    CHECK(floats(tensor<int32_t>({-3, 7}, {2}).to(DType::f32)) == std::vector<float>{-3, 7});
  }
  SUBCASE("non-contiguous source") {
    Tensor x = iota({2, 3}).t().to(DType::f64);
    CHECK(x.is_contiguous());
    CHECK(x.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
  }
}

TEST_CASE("tensor: item and to_vector") {
  CHECK(scalar_tensor(-4.0, {.dtype = DType::i32}).item<int32_t>() == -4);
  CHECK(tensor<float>({1.5f}, {1, 1}).item<double>() == 1.5);
  CHECK(iota({2, 2}).t().to_vector<int64_t>() == std::vector<int64_t>{0, 2, 1, 3});  // logical order
  CHECK_THROWS_WITH_AS(iota({2}).item<float>(), Contains("item(): expected a tensor with one element, got shape [2]"),
                       Error);
  CHECK_THROWS_WITH_AS(iota({2}).data<double>(), Contains("has dtype float32"), Error);
  CHECK_THROWS_WITH_AS(Tensor().shape(), Contains("undefined"), Error);
}

TEST_CASE("tensor: printing") {
  Tensor x = tensor<float>({1, 2, 3, 4}, {2, 2});
  std::string text = x.to_string();
  CHECK(text.find("shape=[2, 2]") != std::string::npos);
  CHECK(text.find("dtype=float32") != std::string::npos);
  CHECK(text.find("device=cpu") != std::string::npos);
  CHECK(text.find("4.0000") != std::string::npos);
  CHECK(text.find("requires_grad") == std::string::npos);
  std::ostringstream stream;
  stream << x;
  CHECK(stream.str() == text);
  CHECK(arange(3).to_string().find("[0, 1, 2]") != std::string::npos);
  CHECK(ones({1}, TensorOptions{}.with_requires_grad()).to_string().find("requires_grad=true") != std::string::npos);
  CHECK(Tensor().to_string() == "tensor(undefined)");

  // Big tensors are summarized: the first and last values with "..." between.
  Tensor big = arange(0, 5000, 1, {.dtype = DType::f32});
  std::string summary = big.to_string();
  CHECK(summary.find("...") != std::string::npos);
  CHECK(summary.find("4999.0000") != std::string::npos);
  CHECK(summary.find("2500.0000") == std::string::npos);
  CHECK(summary.size() < 300);
  std::string big2d = arange(0, 4000, 1, {.dtype = DType::f32}).view({40, 100}).to_string();
  CHECK(big2d.size() < 1000);
  CHECK(big2d.find("3999.0000") != std::string::npos);
}

TEST_CASE("tensor: error messages name the op and the values") {
  CHECK_THROWS_WITH_AS(empty({2, -1}), Contains("empty: negative size in shape [2, -1]"), Error);
  Tensor x = zeros({2, 3});
  CHECK_THROWS_WITH_AS(x.size(5), Contains("dim 5 is out of range for a tensor with 2 dims"), Error);
  CHECK_THROWS_WITH_AS(x.select(-3, 0), Contains("select: dim -3 is out of range"), Error);
  CHECK_THROWS_WITH_AS(x.copy_(zeros({4})), Contains("copy_: cannot broadcast shape [4] to [2, 3]"), Error);
  try {
    (void)x.view({7});
    FAIL("view({7}) did not throw");
  } catch (const Error& error) {
    // The message without location, and what() with file:line.
    CHECK(error.message().find("view: shape [7] is invalid for 6 elements") != std::string::npos);
    CHECK(std::string(error.what()).find("tensor.cpp:") != std::string::npos);
  }
}

TEST_CASE("tensor: shapes whose element, byte or stride count overflows 64 bits are refused before allocating") {
  const auto extent = contiguous_extent({2, 3}, 4);
  REQUIRE(extent.has_value());
  CHECK(extent->numel == 6);
  CHECK(extent->nbytes == 24);
  CHECK(contiguous_extent({}, 8)->nbytes == 8);
  CHECK(contiguous_extent({3, 0, 5}, 4)->numel == 0);
  CHECK_FALSE(contiguous_extent({2, -1}, 4).has_value());

  const int64_t big = int64_t{1} << 32;
  // 2^62 x 4 elements wrap to 0: without the check this "succeeds" with no storage.
  CHECK_THROWS_WITH_AS(empty({int64_t{1} << 62, 4}),
                       Contains("empty: shape [4611686018427387904, 4] of float32 overflows"), Error);
  // 2^60 float64 elements fit as a count but not as bytes.
  CHECK_THROWS_WITH_AS(zeros({int64_t{1} << 40, int64_t{1} << 20}, {.dtype = DType::f64}),
                       Contains("overflows 64 bits"), Error);
  // Empty, but the strides (zeros counted as 1) would overflow; a view must refuse it too.
  CHECK_THROWS_WITH_AS(empty({0, big, big}), Contains("overflows 64 bits"), Error);
  CHECK_THROWS_WITH_AS(empty({0}).view({0, big, big}), Contains("does not fit in 64 bits"), Error);
  CHECK_THROWS_WITH_AS(empty_strided({big, 2}, {int64_t{1} << 62, 1}), Contains("reach past 2^63 bytes"), Error);
  // The largest strides that fit are accepted.
  const Tensor wide_empty = empty({0, int64_t{1} << 31, int64_t{1} << 31});
  CHECK(wide_empty.numel() == 0);
  CHECK(wide_empty.strides()[0] == int64_t{1} << 62);
}

TEST_CASE("tensor: Device::parse and parse_dtype") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("gpu") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:1").str() == "cuda:1");
  for (std::string bad : {"tpu", "cuda:", "cuda:-1", "cuda:1x", "CPU", ""}) {
    CAPTURE(bad);  // (a std::string: this doctest prints a const char* as a pointer)
    CHECK_THROWS_WITH_AS(Device::parse(bad), Contains("cannot parse"), Error);
  }
  CHECK(parse_dtype("float32") == DType::f32);
  CHECK(parse_dtype("fp32") == DType::f32);
  CHECK(parse_dtype("bf16") == DType::bf16);
  CHECK(parse_dtype("half") == DType::f16);
  CHECK(parse_dtype("float64") == DType::f64);
  CHECK(parse_dtype("long") == DType::i64);
  CHECK(parse_dtype("bool") == DType::b8);
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8, DType::b8}) {
    CHECK(parse_dtype(dtype_name(dtype)) == dtype);
  }
  CHECK_THROWS_WITH_AS(parse_dtype("float8"), Contains("unknown dtype 'float8'"), Error);
}

TEST_CASE("tensor: CUDA without a GPU fails clearly") {
  if (cuda::is_available()) return;  // the GPU cases below cover it
  CHECK(cuda::device_count() == 0);
  CHECK_THROWS_WITH_AS(iota({2}).to(Device::cuda(0)), Contains("no such CUDA device"), Error);
  CHECK_THROWS_WITH_AS(iota({2}).cuda(), Contains("to(cuda:0)"), Error);
  if (!cuda::compiled_with_cuda()) {
    CHECK_THROWS_WITH_AS(iota({2}).cuda(), Contains("built without CUDA"), Error);
  }
}

TEST_CASE("tensor: to(cuda) round trip [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor x = iota({3, 5});
  Tensor g = x.to(Device::cuda(0));
  CHECK(g.is_cuda());
  CHECK(g.device() == Device::cuda(0));
  CHECK(g.shape() == x.shape());
  CHECK(floats(g.cpu()) == floats(x));
  // Non-contiguous source and dtype change on the way.
  Tensor gt = x.t().to(Device::cuda(0), DType::bf16);
  CHECK(gt.dtype() == DType::bf16);
  CHECK(floats(gt.cpu().to(DType::f32)) == floats(x.t().contiguous()));
  // Views and fills on the device.
  Tensor z = zeros({4, 4}, {.device = Device::cuda(0)});
  z.select(1, 2).fill_(5.0);
  std::vector<float> zv = floats(z);
  for (int i = 0; i < 16; ++i) CHECK(zv[i] == (i % 4 == 2 ? 5.0f : 0.0f));
  CHECK(floats(g.t().contiguous().cpu()) == floats(x.t().contiguous()));
  CHECK(floats(g.to(DType::f16).to(DType::f32)) == floats(x));
}

TEST_CASE("tensor: a copy between two GPUs is complete when it returns [gpu2]") {
  KILN_REQUIRE_GPUS(2);
  const Tensor values = iota({512, 1024});
  Tensor source = values.to(Device::cuda(0));
  // Transposed: staged in a cuda:0 buffer that returns to cuda:0's pool at once.
  const Tensor copied = source.t().to(Device::cuda(1));
  source.fill_(-1.0);                                          // later work on the source stream
  const Tensor reuse = full({1024, 512}, -2.0, {.device = Device::cuda(0)});  // may take the staging buffer
  CHECK(floats(copied.cpu()) == floats(values.t().contiguous()));
  CHECK(sum(reuse).item<double>() == -2.0 * 1024 * 512);
}

TEST_CASE("tensor: a non_blocking copy from pinned memory into another dtype does not wait; cast on the GPU [gpu]") {
  KILN_REQUIRE_GPU();
  // A bf16-true batch: float32 pinned buffers into bfloat16 (and uint8 labels into int64) on the GPU.
  Tensor pinned = arange(0, 4096, 1, {.dtype = DType::f32}).pin_memory();
  Tensor labels = randint(0, 10, {4096}, {.dtype = DType::u8}).pin_memory();
  Tensor inputs = empty({4096}, {.dtype = DType::bf16, .device = Device::cuda(0)});
  Tensor targets = empty({4096}, {.dtype = DType::i64, .device = Device::cuda(0)});
  cuda::device_synchronize(0);
  const cuda::SyncCounters before = cuda::sync_counters();
  inputs.copy_(pinned, /*non_blocking=*/true);
  targets.copy_(labels, /*non_blocking=*/true);
  CHECK(cuda::sync_counters().synchronizations == before.synchronizations);
  KILN_CHECK_CLOSE(inputs.cpu(), pinned.to(DType::bf16), 0, 0);
  KILN_CHECK_CLOSE(targets.cpu(), labels.to(DType::i64), 0, 0);
}

TEST_CASE("tensor: non_blocking copy into pinned memory [gpu]") {
  KILN_REQUIRE_GPU();
  Tensor device_values = arange(0, 4096, 1, {.dtype = DType::f32, .device = Device::cuda(0)});
  Tensor pinned = empty({4096}, {.pinned = true});
  CHECK(pinned.is_pinned());
  CHECK(cuda::is_pinned(pinned.data_ptr()));
  CHECK_FALSE(cuda::is_pinned(iota({4}).data_ptr()));
  cuda::device_synchronize(0);
  const cuda::SyncCounters before = cuda::sync_counters();
  pinned.copy_(device_values, /*non_blocking=*/true);
  const cuda::SyncCounters after = cuda::sync_counters();
  CHECK(after.device_to_host_copies == before.device_to_host_copies + 1);
  CHECK(after.synchronizations == before.synchronizations);  // nothing waited
  cuda::stream_synchronize(cuda::current_stream(0));
  std::vector<float> values = floats(pinned);
  for (int i = 0; i < 4096; i += 511) CHECK(values[i] == static_cast<float>(i));
  // A blocking copy into pageable memory synchronizes.
  const cuda::SyncCounters before_blocking = cuda::sync_counters();
  Tensor pageable = device_values.cpu();
  CHECK(cuda::sync_counters().synchronizations > before_blocking.synchronizations);
  CHECK(pageable.to_vector<float>()[4095] == 4095.0f);
  // pin_memory copies into page-locked memory.
  Tensor repinned = iota({8}).pin_memory();
  CHECK(repinned.is_pinned());
  CHECK(floats(repinned) == floats(iota({8})));
}

}  // namespace kiln
