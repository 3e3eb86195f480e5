// Precision "bf16-true" as Lightning means it: bfloat16 parameters and
// optimizer state, no float32 master copy (Optimizer::set_master_weights(false));
// "bf16-true-fp32-master" keeps the masters. The optimizers without masters
// against the float64 reference rounded to the 16-bit dtype after every step,
// a fit in each precision, and the memory each one holds (memory_stats).
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "tests/test_optim_reference.h"
#include "trainer/trainer.h"

using namespace kiln;
using namespace kiln::testing::optim_ref;

namespace {

// `v` rounded to `dtype` (as the kernels store a 16-bit state or param).
void round_to(std::vector<double>& v, DType dtype) {
  if (v.empty()) return;
  v = values(from_doubles(v, {static_cast<int64_t>(v.size())}, dtype));
}

// One step of the reference, as the kernels keep a 16-bit state: the param
// and the state rounded to `dtype` after the step; LAMB's update (and its norm)
// is made from the rounded moments, which both kernel stages read.
void rounded_ref_step(const Config& c, const Hyper& h, RefState& s, const std::vector<double>& grad, DType dtype) {
  if (c.kind != Kind::lamb) {
    ref_step(c, h, s, grad);
  } else {
    ++s.step;
    const size_t n = s.p.size();
    if (s.m.empty()) s.m.assign(n, 0.0), s.v.assign(n, 0.0);
    const double t = static_cast<double>(s.step);
    const double bc1 = c.bias_correction ? 1 - std::pow(h.momentum, t) : 1.0;
    const double bc2 = c.bias_correction ? 1 - std::pow(h.beta2, t) : 1.0;
    for (size_t i = 0; i < n; ++i) {
      s.m[i] = h.momentum * s.m[i] + (1 - h.momentum) * grad[i];
      s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * grad[i] * grad[i];
    }
    round_to(s.m, dtype);
    round_to(s.v, dtype);
    std::vector<double> u(n);
    for (size_t i = 0; i < n; ++i) {
      u[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + c.eps) + h.weight_decay * s.p[i];
    }
    const double pn = norm2(s.p), un = norm2(u);
    const double ratio = pn > 0 && un > 0 ? pn / un : 1.0;
    for (size_t i = 0; i < n; ++i) s.p[i] -= h.lr * ratio * u[i];
  }
  for (std::vector<double>* kept : {&s.p, &s.buf, &s.m, &s.v, &s.vmax}) round_to(*kept, dtype);
}

// Largest |got - ref| / allowed over the elements of a param after one step
// from `prev`, allowed = 2 ulp of |prev| + |step| (+ 1e-6): a state one rounding
// off changes the step by an ulp of itself, which p - step may leave far larger
// than an ulp of a result near zero.
double step_error_ratio(const std::vector<double>& got, const std::vector<double>& ref,
                        const std::vector<double>& prev, double ulp) {
  double worst = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double allowed = 2 * ulp * (std::abs(prev[e]) + std::abs(prev[e] - ref[e])) + 1e-6;
    const double ratio = std::abs(got[e] - ref[e]) / allowed;
    if (!(ratio <= worst)) worst = ratio;  // NaN wins
  }
  return worst;
}

// The reference vector a state buffer of `name` is compared with and synced to.
std::vector<double>& reference_buffer(RefState& s, const std::string& name) {
  if (name == "exp_avg") return s.m;
  if (name == "exp_avg_sq") return s.v;
  if (name == "max_exp_avg_sq") return s.vmax;
  return s.buf;  // momentum_buffer
}

}  // namespace

TEST_CASE("optimizers without master weights keep 16-bit state; each step is the reference step rounded to it") {
  const std::vector<int64_t> sizes = {70001, 33};  // the first spans two kernel chunks
  for (const Config& c : configs()) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      std::mt19937_64 rng(17);
      std::vector<Tensor> params;
      std::vector<RefState> refs;
      std::vector<optim::ParamGroup> groups(2);
      for (size_t i = 0; i < sizes.size(); ++i) {
        Tensor p = from_doubles(normals(rng, static_cast<size_t>(sizes[i]), 0.5), {sizes[i]}, dtype);
        p.requires_grad_(true);
        params.push_back(p);
        refs.push_back(RefState{values(p)});
        groups[i].params.push_back(p);
      }
      std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(c, std::move(groups));
      optimizer->set_master_weights(false);
      // One rounding apart: float arithmetic (with float beta1, beta2, ...)
      // against float64 may round a state or the param the other way.
      const double ulp = dtype == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
      std::vector<std::vector<double>> before_step(2);
      for (int64_t k = 1; k <= 5; ++k) {
        CAPTURE(k);
        for (size_t i = 0; i < params.size(); ++i) {
          const Tensor grad = from_doubles(normals(rng, static_cast<size_t>(params[i].numel()), 0.7),
                                           params[i].shape(), dtype);
          params[i].set_grad(grad);
          before_step[i] = refs[i].p;
          rounded_ref_step(c, c.group[i], refs[i], values(grad), dtype);
        }
        optimizer->step();
        for (size_t i = 0; i < params.size(); ++i) {
          CAPTURE(i);
          const int64_t index = static_cast<int64_t>(i);
          CHECK(step_error_ratio(values(params[i]), refs[i].p, before_step[i], ulp) <= 1.0);
          CHECK_FALSE(optimizer->state(index, "master").defined());
          for (const std::string& name : optimizer->buffer_names(index)) {
            CAPTURE(name);
            const Tensor buffer = optimizer->state(index, name);
            REQUIRE(buffer.defined());
            CHECK(buffer.dtype() == dtype);
            CHECK(worst_ratio(values(buffer), reference_buffer(refs[i], name), ulp, 1e-6) <= 1.0);
            reference_buffer(refs[i], name) = values(buffer);  // the next step starts from the kernel's state
          }
          refs[i].p = values(params[i]);
        }
      }
      // The layout is fixed once state exists.
      CHECK(kiln::testing::error_of([&] { optimizer->set_master_weights(true); })
                .find("already holds state") != std::string::npos);
    }
  }
}

namespace {

constexpr int64_t kInputs = 256, kHidden = 1024;

// (512, 256) inputs, targets a fixed linear function of them.
std::shared_ptr<TensorDataset> wide_regression() {
  manual_seed(5);
  Tensor x = randn({512, kInputs});
  Tensor w = mul(randn({kInputs, 1}), 0.1);
  return std::make_shared<TensorDataset>(x, matmul(x, w));
}

struct WideRegression : TrainModule {
  WideRegression() {
    manual_seed(3);
    net.push_back(std::make_shared<nn::Linear>(kInputs, kHidden));
    net.push_back(std::make_shared<nn::Tanh>());
    net.push_back(std::make_shared<nn::Linear>(kHidden, 1));
  }
  nn::Module& model() override { return net; }
  Tensor training_step(const Batch& batch, int64_t) override {
    Tensor difference = sub(net.forward(batch.input), batch.target);
    Tensor loss = mean(mul(difference, difference));
    losses.push_back(loss.to(DType::f32).item<double>());
    return loss;
  }
  OptimizerConfigs configure_optimizers() override {
    optim::AdamWOptions adamw;
    adamw.lr = 3e-3;
    return OptimizerConfig{std::make_unique<optim::AdamW>(net.parameters(), adamw)};
  }
  nn::Sequential net;
  std::vector<double> losses;
};

struct Held {
  size_t bytes = 0;  // CPU tensor memory held after fit: model, optimizer state, loader buffers
  std::vector<double> losses;
  DType param_dtype = DType::f32;
  bool has_master = false;
  DType state_dtype = DType::f32;
};

Held fit_in(const std::string& precision) {
  auto data = wide_regression();
  DataLoader loader(data, kiln::testing::seeded_loader_options(32));
  const size_t before = memory_stats(Device::cpu()).allocated_bytes;
  Held held;
  {
    WideRegression module;
    TrainerOptions options = kiln::testing::quiet_trainer_options();
    options.max_epochs = 6;
    options.precision = precision;
    options.logger = false;
    options.enable_checkpointing = false;
    Trainer trainer(options);
    trainer.fit(module, loader);
    // Gradients are gone (zero_grad sets them to none); what stays is what a run holds between steps.
    held.bytes = memory_stats(Device::cpu()).allocated_bytes - before;
    held.losses = module.losses;
    held.param_dtype = module.net.parameters().front().dtype();
    held.has_master = trainer.optimizer().state(0, "master").defined();
    held.state_dtype = trainer.optimizer().state(0, "exp_avg").dtype();
  }
  return held;
}

}  // namespace

TEST_CASE("Trainer bf16-true trains with bfloat16 weights and AdamW state and no master copy, in 3/7 of bf16-true-fp32-master's memory") {
  const Held lean = fit_in("bf16-true");
  const Held master = fit_in("bf16-true-fp32-master");
  const Held mixed = fit_in("bf16-mixed");
  const size_t params = kInputs * kHidden + kHidden + kHidden + 1;
  MESSAGE("held after fit (MiB): bf16-true " << lean.bytes / 1048576.0 << ", bf16-true-fp32-master "
                                           << master.bytes / 1048576.0 << ", bf16-mixed " << mixed.bytes / 1048576.0);
  CHECK(lean.param_dtype == DType::bf16);
  CHECK_FALSE(lean.has_master);
  CHECK(lean.state_dtype == DType::bf16);
  CHECK(master.param_dtype == DType::bf16);
  CHECK(master.has_master);
  CHECK(master.state_dtype == DType::f32);
  CHECK(mixed.param_dtype == DType::f32);
  // Bytes per parameter: weights + AdamW's exp_avg and exp_avg_sq (+ the float32 master):
  // 2 + 2 * 2 = 6, 2 + 4 + 2 * 4 = 14, 4 + 2 * 4 = 12; beyond that only the loader's buffers.
  const size_t slack = 512 * 1024;
  CHECK(lean.bytes >= 6 * params);
  CHECK(lean.bytes <= 6 * params + slack);
  CHECK(master.bytes >= 14 * params);
  CHECK(master.bytes <= 14 * params + slack);
  CHECK(mixed.bytes >= 12 * params);
  CHECK(mixed.bytes <= 12 * params + slack);
  // All three learn: the last epoch's loss is far below the first step's.
  for (const Held* run : {&lean, &master, &mixed}) {
    REQUIRE(run->losses.size() == 6 * 16);
    double last_epoch = 0;
    for (size_t i = run->losses.size() - 16; i < run->losses.size(); ++i) last_epoch += run->losses[i] / 16;
    CHECK(last_epoch < 0.2 * run->losses.front());
  }
}

TEST_CASE("Trainer bf16-true on a GPU keeps bfloat16 state and tracks the CPU run [gpu]") {
  KILN_REQUIRE_GPU();
  auto run_on = [](const std::string& accelerator) {
    auto data = wide_regression();
    DataLoader loader(data, kiln::testing::seeded_loader_options(32));
    WideRegression module;
    TrainerOptions options = kiln::testing::quiet_trainer_options();
    options.accelerator = accelerator;
    options.max_epochs = 2;
    options.precision = "bf16-true";
    options.logger = false;
    options.enable_checkpointing = false;
    Trainer trainer(options);
    trainer.fit(module, loader);
    CHECK(trainer.optimizer().state(0, "exp_avg").dtype() == DType::bf16);
    CHECK_FALSE(trainer.optimizer().state(0, "master").defined());
    return module.losses;
  };
  const std::vector<double> gpu = run_on("gpu"), cpu = run_on("cpu");
  REQUIRE(gpu.size() == cpu.size());
  // bfloat16 matmuls accumulate differently on the two devices: the losses agree loosely.
  CHECK(std::abs(gpu.back() - cpu.back()) <= 0.1 * cpu.front());
}
