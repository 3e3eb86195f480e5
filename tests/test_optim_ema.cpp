// Weight averaging: EMA (torch's lerp form) and SWA's running mean.
#include <doctest/doctest.h>

#include "core/autograd.h"
#include "kernels/cuda/runtime.h"
#include "optim/ema.h"
#include "tests/support/test_util.h"
#include "tests/test_optim_reference.h"

using namespace kiln;
using namespace kiln::optim;
using namespace kiln::testing::optim_ref;

namespace {
void randomize(const std::vector<Tensor>& params, std::mt19937_64& rng) {
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor target = p;
    target.copy_(from_doubles(normals(rng, static_cast<size_t>(p.numel()), 1.0), p.shape(), DType::f64));
  }
}
}  // namespace

TEST_CASE("EMA follows avg = lerp(avg, param, 1 - decay)") {
  for (bool warmup : {false, true}) {
    std::vector<Tensor> params = {zeros({70000}), zeros({5}, {.dtype = DType::bf16}), zeros({3}, {.dtype = DType::f64})};
    std::mt19937_64 rng(1);
    randomize(params, rng);
    ExponentialMovingAverage ema(params, 0.9, warmup);
    std::vector<std::vector<double>> ref;
    for (const Tensor& p : params) ref.push_back(values(p));
    for (int k = 1; k <= 6; ++k) {
      randomize(params, rng);
      const double decay = warmup ? std::min(0.9, (1.0 + k) / (10.0 + k)) : 0.9;
      for (size_t i = 0; i < params.size(); ++i) {
        const std::vector<double> p = values(params[i]);
        for (size_t j = 0; j < p.size(); ++j) ref[i][j] += (1 - decay) * (p[j] - ref[i][j]);
      }
      ema.update();
    }
    CHECK(ema.averages()[1].dtype() == DType::f32);  // 16-bit params average in float32
    for (size_t i = 0; i < params.size(); ++i) {
      const double rtol = params[i].dtype() == DType::f64 ? 1e-14 : 1e-6;
      CHECK(worst_ratio(values(ema.averages()[i]), ref[i], rtol, 1e-7) <= 1.0);
    }
    CHECK(ema.num_updates() == 6);
  }
}

TEST_CASE("EMA skip flag, copy_to, store/restore, state_dict") {
  std::vector<Tensor> params = {from_doubles({1, 2}, {2}, DType::f32)};
  ExponentialMovingAverage ema(params, 0.5);
  Tensor flag = ones({});
  {
    NoGradGuard no_grad;
    params[0].fill_(3.0);
  }
  ema.update(flag);  // skipped on the device
  CHECK(values(ema.averages()[0]) == std::vector<double>{1, 2});
  flag.fill_(0.0);
  ema.update(flag);
  CHECK(values(ema.averages()[0]) == std::vector<double>{2, 2.5});
  ema.store();
  ema.copy_to(params);
  CHECK(values(params[0]) == std::vector<double>{2, 2.5});
  ema.restore();
  CHECK(values(params[0]) == std::vector<double>{3, 3});
  StateDict dict = ema.state_dict();
  dict.meta = nlohmann::json::parse(dict.meta.dump());
  for (auto& [name, t] : dict.tensors) t = t.clone();
  ExponentialMovingAverage other(params, 0.5);
  other.load_state_dict(dict);
  CHECK(values(other.averages()[0]) == std::vector<double>{2, 2.5});
  CHECK(other.num_updates() == 2);
  CHECK_THROWS_WITH_AS(ExponentialMovingAverage(params, 1.5), doctest::Contains("decay must be in [0, 1]"), Error);
}

TEST_CASE("WeightAverage is the running mean of the snapshots") {
  std::vector<Tensor> params = {zeros({70000}), zeros({7}, {.dtype = DType::f16})};
  WeightAverage swa(params);
  std::mt19937_64 rng(2);
  std::vector<std::vector<double>> sum(2);
  for (int k = 0; k < 5; ++k) {
    randomize(params, rng);
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<double> p = values(params[i]);
      sum[i].resize(p.size(), 0.0);
      for (size_t j = 0; j < p.size(); ++j) sum[i][j] += p[j];
    }
    swa.update();
    if (k == 0) CHECK(values(swa.averages()[1]) == values(params[1]));  // the first update copies
  }
  for (size_t i = 0; i < 2; ++i) {
    for (double& x : sum[i]) x /= 5;
    CHECK(worst_ratio(values(swa.averages()[i]), sum[i], 1e-6, 1e-7) <= 1.0);
  }
  CHECK(swa.n_averaged() == 5);
  WeightAverage other(params);
  other.load_state_dict(swa.state_dict());
  CHECK(other.n_averaged() == 5);
  CHECK(values(other.averages()[0]) == values(swa.averages()[0]));
}

TEST_CASE("averaging on CUDA matches the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  std::vector<Tensor> cpu = {zeros({70000}), zeros({9}, {.dtype = DType::bf16})};
  std::vector<Tensor> gpu = {zeros({70000}, {.device = Device::cuda()}),
                             zeros({9}, {.dtype = DType::bf16, .device = Device::cuda()})};
  ExponentialMovingAverage ec(cpu, 0.99), eg(gpu, 0.99);
  WeightAverage sc(cpu), sg(gpu);
  std::mt19937_64 rc(3), rg(3);
  for (int k = 0; k < 4; ++k) {
    randomize(cpu, rc);
    randomize(gpu, rg);
    ec.update();
    eg.update();
    sc.update();
    sg.update();
  }
  for (size_t i = 0; i < 2; ++i) {
    CHECK(worst_ratio(values(eg.averages()[i]), values(ec.averages()[i]), 1e-6, 1e-7) <= 1.0);
    CHECK(worst_ratio(values(sg.averages()[i]), values(sc.averages()[i]), 1e-6, 1e-7) <= 1.0);
  }
}
