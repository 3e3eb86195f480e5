// Channels-last (NHWC) tensors, torch.channels_last: the layout predicates,
// contiguous(MemoryFormat), and which ops keep the layout of their input
// (elementwise ops, casts, copies across devices), with values equal to the
// same ops on NCHW tensors. Convolutions, batch norm and pooling test their own
// channels-last paths in test_nn_ops.cpp.
#include <doctest/doctest.h>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "nn/conv.h"
#include "nn/models.h"
#include "tests/support/test_util.h"

namespace kiln {
namespace {

using doctest::Contains;

Tensor random_nchw(const Shape& shape, uint64_t seed, DType dtype = DType::f32) {
  return tensor<double>(testing::random_values(shape_numel(shape), seed), shape).to(dtype);
}

void check_exact(const Tensor& actual, const Tensor& expected) { KILN_CHECK_CLOSE(actual, expected, 0.0, 0.0); }

TEST_CASE("channels_last: strides, is_channels_last and contiguous(MemoryFormat)") {
  CHECK(channels_last_strides({2, 3, 4, 5}) == Shape{60, 1, 15, 3});
  const Tensor x = random_nchw({2, 3, 4, 5}, 1);
  CHECK_FALSE(is_channels_last(x));
  const Tensor cl = x.contiguous(MemoryFormat::channels_last);
  CHECK(is_channels_last(cl));
  CHECK_FALSE(cl.is_contiguous());
  CHECK(cl.strides() == Shape{60, 1, 15, 3});
  check_exact(cl, x);
  CHECK(cl.contiguous(MemoryFormat::channels_last).same(cl));  // no copy when it has the layout
  CHECK(cl.contiguous().is_contiguous());
  check_exact(cl.contiguous(), x);
  // The same strides reached by a permute of an NHWC tensor.
  CHECK(is_channels_last(random_nchw({2, 4, 5, 3}, 2).permute({0, 3, 1, 2})));
  // Where both layouts address the same memory (one channel, or one pixel) the
  // strides decide: a plain tensor is not channels-last, contiguous(channels_last)
  // gives a view with the channels-last strides (no copy) that is.
  for (const Shape& shape : {Shape{2, 1, 4, 5}, Shape{2, 3, 1, 1}}) {
    INFO("shape " << shape_str(shape));
    const Tensor plain = random_nchw(shape, 3);
    CHECK_FALSE(is_channels_last(plain));
    const Tensor restrided = plain.contiguous(MemoryFormat::channels_last);
    CHECK(is_channels_last(restrided));
    CHECK(restrided.is_contiguous());  // the same memory order
    CHECK(restrided.data_ptr() == plain.data_ptr());
    CHECK(restrided.strides() == channels_last_strides(shape));
    check_exact(restrided, plain);
    CHECK(is_channels_last(relu(restrided)));  // and ops keep it
  }
  // Other strided layouts are neither.
  CHECK_FALSE(is_channels_last(x.transpose(2, 3)));
  CHECK_FALSE(is_channels_last(random_nchw({4, 5, 3}, 4).permute({2, 0, 1})));
  CHECK(testing::error_of([&] { (void)random_nchw({4, 5, 3}, 4).contiguous(MemoryFormat::channels_last); })
            .find("expected a 4-D tensor") != std::string::npos);
  // contiguous(channels_last) is differentiable: the gradient arrives in x's shape.
  Tensor leaf = x.clone().requires_grad_();
  sum(mul(leaf.contiguous(MemoryFormat::channels_last), 3.0)).backward();
  check_exact(leaf.grad(), full(x.shape(), 3.0));
}

TEST_CASE("channels_last: elementwise ops, casts and where keep the layout; values equal NCHW") {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    INFO("dtype " << dtype_name(dtype));
    const Tensor x = random_nchw({2, 3, 5, 7}, 10, dtype), y = random_nchw({2, 3, 5, 7}, 11, dtype);
    const Tensor bias = random_nchw({1, 3, 1, 1}, 12, dtype);
    const Tensor xc = x.contiguous(MemoryFormat::channels_last), yc = y.contiguous(MemoryFormat::channels_last);
    const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>> ops = {
        {"relu", [](const Tensor& a, const Tensor&) { return relu(a); }},
        {"gelu", [](const Tensor& a, const Tensor&) { return gelu(a); }},
        {"exp", [](const Tensor& a, const Tensor&) { return exp(a); }},
        {"mul scalar", [](const Tensor& a, const Tensor&) { return mul(a, 0.5); }},
        {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
        {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
        {"sub with alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 2.0); }},
        {"add bias (1, C, 1, 1)", [&](const Tensor& a, const Tensor&) { return add(a, bias); }},
        {"bias (1, C, 1, 1) + x", [&](const Tensor& a, const Tensor&) { return add(bias, a); }},
        {"where", [](const Tensor& a, const Tensor& b) { return where(gt(a, b), a, b); }},
        {"gt", [](const Tensor& a, const Tensor& b) { return cast(gt(a, b), a.dtype()); }},
    };
    for (const auto& [name, op] : ops) {
      INFO("op " << name);
      const Tensor got = op(xc, yc), want = op(x, y);
      CHECK(is_channels_last(got));
      check_exact(got, want);
    }
    // The first operand with the result's shape decides: an NCHW first operand gives NCHW.
    CHECK(add(x, yc).is_contiguous());
    check_exact(add(x, yc), add(x, y));
    CHECK(is_channels_last(add(xc, y)));
    check_exact(add(xc, y), add(x, y));
    // Casts and to() keep it (torch's preserve_format).
    const DType other = dtype == DType::f64 ? DType::f32 : DType::f64;
    CHECK(is_channels_last(cast(xc, other)));
    check_exact(cast(xc, other), cast(x, other));
    CHECK(is_channels_last(xc.to(other)));
    check_exact(xc.to(other), x.to(other));
    // In place into a channels-last tensor.
    Tensor target = xc.clone().contiguous(MemoryFormat::channels_last);
    target.add_(y);
    CHECK(is_channels_last(target));
    check_exact(target, add(x, y));
  }
}

TEST_CASE("channels_last: copy_ and fill_ across layouts") {
  const Tensor x = random_nchw({3, 4, 6, 5}, 20);
  Tensor into_cl = empty_strided(x.shape(), channels_last_strides(x.shape()), {});
  into_cl.copy_(x);
  CHECK(is_channels_last(into_cl));
  check_exact(into_cl, x);
  Tensor into_nchw = empty(x.shape());
  into_nchw.copy_(into_cl);
  check_exact(into_nchw, x);
  // A dtype-converting copy between layouts.
  Tensor into_f64 = empty_strided(x.shape(), channels_last_strides(x.shape()), {.dtype = DType::f64});
  into_f64.copy_(x.transpose(2, 3).transpose(2, 3));
  check_exact(into_f64, x.to(DType::f64));
  into_cl.fill_(2.5);
  check_exact(into_cl, full(x.shape(), 2.5));
  into_cl.zero_();
  check_exact(into_cl, zeros(x.shape()));
}

TEST_CASE("channels_last: gradients through elementwise ops equal the NCHW ones") {
  const Tensor x = random_nchw({2, 4, 3, 3}, 30), bias = random_nchw({1, 4, 1, 1}, 31);
  Tensor nchw = x.clone().requires_grad_(), cl_leaf = x.clone().requires_grad_();
  const auto f = [&](const Tensor& input) { return sum(mul(relu(add(mul(input, 2.0), bias)), input)); };
  f(nchw).backward();
  const Tensor cl = cl_leaf.contiguous(MemoryFormat::channels_last);
  const Tensor hidden = relu(add(mul(cl, 2.0), bias));
  CHECK(is_channels_last(hidden));
  sum(mul(hidden, cl)).backward();
  check_exact(cl_leaf.grad(), nchw.grad());
}

TEST_CASE("channels_last: a channels-last leaf's .grad is channels-last, a row-major leaf's row-major") {
  const Tensor x = random_nchw({2, 3, 4, 5}, 80);
  Tensor cl_leaf = x.contiguous(MemoryFormat::channels_last).detach().requires_grad_();
  Tensor plain_leaf = x.clone().requires_grad_();
  // A channels-last gradient into each (relu keeps its input's layout), and a
  // row-major one into the channels-last leaf.
  sum(mul(relu(cl_leaf), 2.0)).backward();
  CHECK(is_channels_last(cl_leaf.grad()));
  sum(mul(relu(plain_leaf.contiguous(MemoryFormat::channels_last)), 2.0)).backward();
  CHECK(plain_leaf.grad().is_contiguous());
  check_exact(cl_leaf.grad(), plain_leaf.grad());
  Tensor cl_leaf2 = x.contiguous(MemoryFormat::channels_last).detach().requires_grad_();
  sum(mul(relu(cl_leaf2.contiguous()), 2.0)).backward();
  CHECK(is_channels_last(cl_leaf2.grad()));
  check_exact(cl_leaf2.grad(), plain_leaf.grad());
  // Accumulation keeps the layout and adds the values.
  sum(mul(relu(cl_leaf2.contiguous()), 2.0)).backward();
  CHECK(is_channels_last(cl_leaf2.grad()));
  check_exact(cl_leaf2.grad(), mul(plain_leaf.grad(), 2.0));
}

TEST_CASE("channels_last: batch_norm_relu on NHWC rows equals NCHW in float32 and bfloat16, forward and backward") {
  // The CPU computes NHWC batch norm over rows of channels (its own loops):
  // the same statistics in double and the same per-element arithmetic.
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (bool training : {true, false}) {
      INFO("dtype " << dtype_name(dtype) << " training " << training);
      const Tensor x = random_nchw({4, 24, 5, 6}, 70, dtype), dy = random_nchw({4, 24, 5, 6}, 71, dtype);
      const Tensor weight = random_nchw({24}, 72), bias = random_nchw({24}, 73);
      const Tensor running_mean = mul(random_nchw({24}, 74), 0.1), running_var = ones({24});
      Tensor plain = x.clone().requires_grad_();
      Tensor nhwc = x.contiguous(MemoryFormat::channels_last).detach().requires_grad_();
      const Tensor y_plain = batch_norm_relu(plain, running_mean.clone(), running_var.clone(), weight, bias, training);
      const Tensor y_nhwc = batch_norm_relu(nhwc, running_mean.clone(), running_var.clone(), weight, bias, training);
      CHECK(is_channels_last(y_nhwc));
      const double tol = dtype == DType::bf16 ? 1e-2 : 1e-5;
      KILN_CHECK_CLOSE(y_nhwc.to(DType::f32), y_plain.to(DType::f32), tol, tol);
      y_plain.backward(dy);
      y_nhwc.backward(dy.contiguous(MemoryFormat::channels_last));
      KILN_CHECK_CLOSE(nhwc.grad().to(DType::f32), plain.grad().to(DType::f32), tol, tol);
    }
  }
}

TEST_CASE("channels_last: to(cuda) and back keep the layout; CUDA elementwise ops keep it [gpu]") {
  KILN_REQUIRE_GPU();
  const Tensor x = random_nchw({4, 8, 5, 6}, 40), y = random_nchw({4, 8, 5, 6}, 41);
  const Tensor xc = x.contiguous(MemoryFormat::channels_last), yc = y.contiguous(MemoryFormat::channels_last);
  const Tensor on_gpu = xc.to(Device::cuda(0));
  CHECK(is_channels_last(on_gpu));
  const Tensor pinned = xc.pin_memory();
  const Tensor from_pinned = pinned.to(Device::cuda(0), /*non_blocking=*/true);
  const Tensor y_gpu = yc.to(Device::cuda(0));
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dtype));
    const Tensor a = on_gpu.to(dtype), b = y_gpu.to(dtype);
    CHECK(is_channels_last(a));
    const Tensor sum_gpu = add(relu(a), b, 0.5);
    CHECK(is_channels_last(sum_gpu));
    const Tensor back = sum_gpu.cpu();
    CHECK(is_channels_last(back));
    check_exact(back, add(relu(x.to(dtype)), y.to(dtype), 0.5));
  }
  check_exact(from_pinned.cpu(), x);
  // Into an NCHW tensor on the GPU, and from the GPU into an NCHW host tensor.
  Tensor nchw_gpu = empty(x.shape(), {.device = Device::cuda(0)});
  nchw_gpu.copy_(xc);
  check_exact(nchw_gpu.cpu(), x);
  Tensor host = empty(x.shape());
  host.copy_(on_gpu);
  check_exact(host, x);
}

// Two copies of a model with the same weights, the second in `format`.
template <typename Model>
std::pair<std::shared_ptr<Model>, std::shared_ptr<Model>> twin_models(MemoryFormat format, Device device) {
  manual_seed(7);
  auto plain = std::make_shared<Model>(), other = std::make_shared<Model>();
  other->load_state_dict(plain->state_dict());
  other->to(format);
  plain->to(device);
  other->to(device);
  return {plain, other};
}

void check_grads_close(nn::Module& got, nn::Module& want, double rtol, double atol) {
  const auto got_params = got.named_parameters(), want_params = want.named_parameters();
  REQUIRE(got_params.size() == want_params.size());
  for (size_t i = 0; i < got_params.size(); ++i) {
    INFO("parameter " << got_params[i].first);
    CHECK(got_params[i].second.is_contiguous());  // parameters keep their layout
    KILN_CHECK_CLOSE(got_params[i].second.grad().cpu(), want_params[i].second.grad().cpu(), rtol, atol);
  }
}

TEST_CASE("Module::to(MemoryFormat): every convolution takes it; on the CPU results equal the NCHW model's") {
  auto [plain, channels_last] = twin_models<nn::FashionCNN>(MemoryFormat::channels_last, Device::cpu());
  int convolutions = 0;
  for (const auto& [name, module] : channels_last->named_modules()) {
    if (auto conv = std::dynamic_pointer_cast<nn::Conv2d>(module)) {
      CHECK(conv->memory_format == MemoryFormat::channels_last);
      ++convolutions;
    }
  }
  CHECK(convolutions == 2);
  const Tensor x = random_nchw({3, 1, 28, 28}, 50);
  const Tensor target = tensor<int64_t>({1, 4, 9}, {3});
  cross_entropy(plain->forward(x), target).backward();
  cross_entropy(channels_last->forward(x), target).backward();
  check_grads_close(*channels_last, *plain, 0.0, 0.0);
  channels_last->to(MemoryFormat::contiguous);
  for (const auto& [name, module] : channels_last->named_modules()) {
    if (auto conv = std::dynamic_pointer_cast<nn::Conv2d>(module)) CHECK(conv->memory_format == MemoryFormat::contiguous);
  }
}

TEST_CASE("Module::to(MemoryFormat) on the GPU: ResNet-9 runs channels-last from its 1-channel input on [gpu]") {
  KILN_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  auto [plain, channels_last] = twin_models<nn::ResNet9>(MemoryFormat::channels_last, gpu);
  const Tensor x = random_nchw({8, 1, 28, 28}, 60).to(gpu);
  const Tensor target = tensor<int64_t>({0, 1, 2, 3, 4, 5, 6, 7}, {8}).to(gpu);
  // The layout starts at the first convolution (its input and weight have one
  // channel: the weight's channels-last strides decide) and carries through
  // batch norm, ReLU, pooling and the residual add.
  const Tensor prep = channels_last->prep->forward(x);
  CHECK(is_channels_last(prep));
  const Tensor layer1 = channels_last->layer1->forward(prep);
  CHECK(is_channels_last(layer1));
  CHECK(is_channels_last(channels_last->residual1->forward(layer1)));
  const Tensor want = plain->forward(x), got = channels_last->forward(x);
  // cuDNN's NHWC and NCHW algorithms sum in different orders (and may use TF32).
  KILN_CHECK_CLOSE(got.cpu(), want.cpu(), 1e-2, 1e-3);
  cross_entropy(want, target).backward();
  cross_entropy(got, target).backward();
  check_grads_close(*channels_last, *plain, 5e-2, 5e-3);
}

}  // namespace
}  // namespace kiln
