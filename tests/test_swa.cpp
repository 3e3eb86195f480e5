// AveragedModel and update_bn (torch.optim.swa_utils) on nn modules.
#include <doctest/doctest.h>

#include "core/autograd.h"
#include "core/generator.h"
#include "data/dataloader.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "optim/swa.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {

// Linear(3, 4) -> BatchNorm1d(4): the Linear's bias is dropped by Sequential.
struct LinearBn {
  LinearBn() {
    manual_seed(7);
    linear = std::make_shared<nn::Linear>(3, 4);
    bn = std::make_shared<nn::BatchNorm1d>(4);
    model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{linear, bn});
  }
  std::shared_ptr<nn::Linear> linear;
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Sequential> model;
};

void fill_random(nn::Module& model) {
  NoGradGuard no_grad;
  for (Tensor p : model.parameters()) p.copy_(randn(p.shape()));
  for (auto& [name, b] : model.named_buffers()) {
    Tensor buffer = b;
    if (is_floating(buffer.dtype())) buffer.copy_(randn(buffer.shape()));
  }
}

std::vector<double> doubles(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }
Tensor tensor_of(const std::vector<double>& values, const Shape& shape) { return tensor<double>(values, shape); }

}  // namespace

TEST_CASE("AveragedModel: the average of 3 snapshots is their arithmetic mean") {
  for (bool use_buffers : {false, true}) {
    LinearBn net;
    optim::AveragedModelOptions options;
    options.use_buffers = use_buffers;
    optim::AveragedModel average(*net.model, options);
    CHECK(average.n_averaged() == 0);
    const nn::StateDict names = net.model->state_dict();
    std::map<std::string, std::vector<double>> sums;
    std::map<std::string, std::vector<double>> last;
    manual_seed(1);
    for (int snapshot = 0; snapshot < 3; ++snapshot) {
      fill_random(*net.model);
      for (const auto& [name, tensor] : net.model->state_dict()) {
        const std::vector<double> value = doubles(tensor);
        auto& sum = sums[name];
        sum.resize(value.size(), 0.0);
        for (size_t i = 0; i < value.size(); ++i) sum[i] += value[i];
        last[name] = value;
      }
      average.update_parameters(*net.model);
    }
    CHECK(average.n_averaged() == 3);
    for (const auto& [name, tensor] : average.parameters()) {
      std::vector<double> mean = sums.at(name);
      for (double& v : mean) v /= 3.0;
      KILN_CHECK_CLOSE(tensor, tensor_of(mean, tensor.shape()), 1e-6, 1e-7);
    }
    for (const auto& [name, tensor] : average.buffers()) {
      if (!is_floating(tensor.dtype())) continue;
      std::vector<double> expected = last.at(name);  // copied from the model unless averaged
      if (use_buffers) {
        expected = sums.at(name);
        for (double& v : expected) v /= 3.0;
      }
      KILN_CHECK_CLOSE(tensor, tensor_of(expected, tensor.shape()), 1e-6, 1e-7);
    }
    // copy_to writes the averaged parameters into another instance.
    LinearBn other;
    average.copy_to(*other.model);
    KILN_CHECK_CLOSE(other.linear->weight, average.parameters()[0].second, 0, 0);
    KILN_CHECK_CLOSE(other.bn->weight, average.parameters()[1].second, 0, 0);
  }
}

TEST_CASE("AveragedModel: a custom avg_fn (EMA), bf16 parameters, state_dict round trip") {
  nn::Linear model(2, 3);
  model.to(DType::bf16);
  optim::AveragedModelOptions options;
  options.avg_fn = optim::get_ema_avg_fn(0.75);
  optim::AveragedModel ema(model, options);
  CHECK(ema.parameters()[0].second.dtype() == DType::f32);  // 16-bit parameters average in float32
  std::vector<double> expected;
  manual_seed(2);
  for (int k = 0; k < 4; ++k) {
    fill_random(model);
    const std::vector<double> value = doubles(model.weight);
    if (k == 0) {
      expected = value;  // the first model is copied
    } else {
      for (size_t i = 0; i < value.size(); ++i) expected[i] = 0.75 * expected[i] + 0.25 * value[i];
    }
    ema.update_parameters(model);
  }
  KILN_CHECK_CLOSE(ema.parameters()[0].second, tensor_of(expected, {3, 2}), 1e-6, 1e-7);

  // The state restores averages and count into an AveragedModel of the same model.
  optim::AveragedModel restored(model, options);
  restored.load_state_dict(ema.state_dict());
  CHECK(restored.n_averaged() == 4);
  KILN_CHECK_CLOSE(restored.parameters()[0].second, ema.parameters()[0].second, 0, 0);
  KILN_CHECK_CLOSE(restored.parameters()[1].second, ema.parameters()[1].second, 0, 0);

  // Another architecture is refused by name and shape.
  nn::Linear wider(2, 4);
  CHECK_THROWS_WITH_AS(ema.update_parameters(wider), doctest::Contains("another architecture"), Error);
  optim::AveragedModel wrong(wider);
  CHECK_THROWS_AS(wrong.load_state_dict(ema.state_dict()), Error);
}

TEST_CASE("update_bn: running statistics become the data set's, momenta and modes are restored") {
  LinearBn net;
  manual_seed(4);
  Tensor x = add(mul(randn({32, 3}), 2.0), 1.0);
  auto data = std::make_shared<TensorDataset>(x, zeros({32, 1}));
  DataLoaderOptions loader_options;
  loader_options.batch_size = 8;
  DataLoader loader(data, loader_options);
  loader.next();  // the pass must not disturb the loader's position
  {
    NoGradGuard no_grad;
    net.bn->running_mean.fill_(5.0);  // stale statistics must be reset first
    net.bn->running_var.fill_(9.0);
  }
  net.model->eval();
  CHECK(optim::contains_batch_norm(*net.model));
  optim::update_bn(loader, *net.model);

  // torch's cumulative average: the mean of the 4 batches' means and unbiased variances.
  std::vector<double> mean(4, 0.0), variance(4, 0.0);
  {
    NoGradGuard no_grad;
    for (int64_t b = 0; b < 4; ++b) {
      Tensor h = net.linear->forward(x.narrow(0, b * 8, 8));
      const std::vector<double> m = doubles(kiln::mean(h, {0})), v = doubles(var(h, {0}, 1));
      for (size_t c = 0; c < 4; ++c) {
        mean[c] += m[c] / 4.0;
        variance[c] += v[c] / 4.0;
      }
    }
  }
  KILN_CHECK_CLOSE(net.bn->running_mean, tensor_of(mean, {4}), 1e-5, 1e-6);
  KILN_CHECK_CLOSE(net.bn->running_var, tensor_of(variance, {4}), 1e-5, 1e-6);
  // With equal batches the mean is the whole data set's.
  {
    NoGradGuard no_grad;
    KILN_CHECK_CLOSE(net.bn->running_mean, kiln::mean(net.linear->forward(x), {0}), 1e-5, 1e-6);
  }
  CHECK(net.bn->num_batches_tracked.item<int64_t>() == 4);
  CHECK(net.bn->momentum == std::optional<double>(0.1));
  CHECK_FALSE(net.model->is_training());
  CHECK(loader.position() == 1);

  // max_batches limits the pass.
  optim::update_bn(loader, *net.model, std::nullopt, 2);
  CHECK(net.bn->num_batches_tracked.item<int64_t>() == 2);

  // A model without BatchNorm reads nothing.
  nn::Linear plain(3, 1);
  int reads = 0;
  optim::update_bn([&] { ++reads; return Tensor(); }, plain);
  CHECK(reads == 0);
  CHECK_FALSE(optim::contains_batch_norm(plain));
}

TEST_CASE("AveragedModel and update_bn on the GPU match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  LinearBn cpu, gpu;
  gpu.model->to(Device::cuda(0));
  optim::AveragedModel cpu_average(*cpu.model);
  optim::AveragedModel gpu_average(*gpu.model);  // averages on the GPU (the fused CUDA kernel)
  optim::AveragedModelOptions on_host;
  on_host.device = Device::cpu();
  optim::AveragedModel host_average(*gpu.model, on_host);  // GPU model, averages on the CPU
  CHECK(gpu_average.device().is_cuda());
  manual_seed(5);
  for (int snapshot = 0; snapshot < 3; ++snapshot) {
    fill_random(*cpu.model);
    gpu.model->load_state_dict(cpu.model->state_dict());
    cpu_average.update_parameters(*cpu.model);
    gpu_average.update_parameters(*gpu.model);
    host_average.update_parameters(*gpu.model);
  }
  for (size_t i = 0; i < cpu_average.parameters().size(); ++i) {
    KILN_CHECK_CLOSE(gpu_average.parameters()[i].second.cpu(), cpu_average.parameters()[i].second, 1e-6, 1e-7);
    KILN_CHECK_CLOSE(host_average.parameters()[i].second, cpu_average.parameters()[i].second, 1e-6, 1e-7);
  }
  auto data = std::make_shared<TensorDataset>(randn({32, 3}), zeros({32, 1}));
  DataLoaderOptions loader_options;
  loader_options.batch_size = 8;
  DataLoader loader(data, loader_options);
  optim::update_bn(loader, *cpu.model);
  optim::update_bn(loader, *gpu.model);  // inputs moved to the model's device
  KILN_CHECK_CLOSE(gpu.bn->running_mean.cpu(), cpu.bn->running_mean, 1e-5, 1e-6);
  KILN_CHECK_CLOSE(gpu.bn->running_var.cpu(), cpu.bn->running_var, 1e-5, 1e-6);
}
