// See ddp_reference.h.
#include "tests/support/ddp_reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <sstream>

#include "core/generator.h"
#include "core/ops.h"
#include "nn/conv.h"
#include "nn/ddp.h"
#include "nn/loss.h"
#include "tests/test_distributed_util.h"

namespace kiln::testing::ddp_reference {

std::shared_ptr<nn::Sequential> make_model(uint64_t seed, DType dtype, bool batch_norm,
                                           std::shared_ptr<distributed::ProcessGroup> sync_group) {
  manual_seed(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(kIn, kHidden));
  if (sync_group) {
    model->push_back(std::make_shared<nn::SyncBatchNorm>(kHidden, sync_group, 1e-5, 0.1, true, true, 0));
  } else if (batch_norm) {
    model->push_back(std::make_shared<nn::BatchNorm1d>(kHidden));
  }
  model->push_back(std::make_shared<nn::Tanh>());
  model->push_back(std::make_shared<nn::Linear>(kHidden, kOut));
  model->to(dtype);
  return model;
}

std::pair<Tensor, Tensor> batch(int step, int64_t begin, int64_t rows, int64_t total_rows, DType dtype) {
  std::mt19937_64 rng(1000 + step);
  std::normal_distribution<double> normal;
  std::vector<double> x(total_rows * kIn), y(total_rows * kOut);
  for (auto& v : x) v = normal(rng);
  for (auto& v : y) v = normal(rng);
  std::vector<double> xs(x.begin() + begin * kIn, x.begin() + (begin + rows) * kIn);
  std::vector<double> ys(y.begin() + begin * kOut, y.begin() + (begin + rows) * kOut);
  return {tensor(xs, {rows, kIn}).to(dtype), tensor(ys, {rows, kOut}).to(dtype)};
}

std::string param_values(const nn::Module& model) {
  std::ostringstream out;
  out.precision(17);
  for (const Tensor& p : model.parameters())
    for (double v : p.to(DType::f64).to_vector<double>()) out << v << ' ';
  for (const auto& [name, b] : model.named_buffers())  // BatchNorm running statistics
    for (double v : b.to(DType::f64).to_vector<double>()) out << v << ' ';
  return out.str();
}

std::unique_ptr<optim::SGD> make_sgd(nn::Module& model) {
  return std::make_unique<optim::SGD>(model.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}

std::string WorkerRun::describe() const {
  std::string text;
  for (size_t r = 0; r < results.size(); ++r)
    text += "rank " + std::to_string(r) + " status " + std::to_string(statuses[r]) + " result: " +
            results[r].substr(0, 400) + "\n  log: " + logs[r].substr(0, 2000) + "\n";
  return text;
}

std::vector<double> reference_params(DType dtype, int world, int steps, int micro, bool batch_norm) {
  auto model = make_model(1234, dtype, batch_norm);
  auto sgd = make_sgd(*model);
  nn::MSELoss mse;
  const int64_t total = 2 * micro * world;
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(step, 0, total, total, dtype);
    mse(model->forward(x), y).backward();
    sgd->step();
    sgd->zero_grad();
  }
  return dist::parse_numbers(param_values(*model));
}

void check_matches_reference(const WorkerRun& run, DType dtype, int world, int steps, int micro,
                             int64_t min_buckets, bool batch_norm) {
  const std::vector<double> expected = reference_params(dtype, world, steps, micro, batch_norm);
  const double rtol = dtype == DType::f64 ? 0 : 1.3e-6, atol = dtype == DType::f64 ? 1e-10 : 1e-5;
  for (int r = 0; r < world; ++r) {
    INFO(run.describe());
    REQUIRE(run.results[r].rfind("buckets ", 0) == 0);
    std::vector<double> got = dist::parse_numbers(run.results[r]);
    CHECK(got.front() >= min_buckets);
    got.erase(got.begin());
    REQUIRE(got.size() == expected.size());
    double worst = 0;
    size_t worst_at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double excess = std::abs(got[i] - expected[i]) - (atol + rtol * std::abs(expected[i]));
      if (i == 0 || excess > worst) worst = excess, worst_at = i;
    }
    CHECK_MESSAGE(worst <= 0, "rank ", r, " parameter element ", worst_at, ": ", got[worst_at], " vs ",
                  expected[worst_at]);
  }
}

}  // namespace kiln::testing::ddp_reference
