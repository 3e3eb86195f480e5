// GradScaler, with torch.amp.GradScaler's semantics:
//   update(): found inf -> scale *= backoff, tracker = 0;
//             else tracker += 1, and at growth_interval scale *= growth, tracker = 0.
// So with init 4, growth 2, backoff 0.25, interval 2, the scale used by three
// finite steps is 4, 4, 8 (after update 1: 4, after update 2: 8, after update 3: 8),
// and an inf step then multiplies by 0.25 and resets the tracker.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "tests/support/test_util.h"
#include "tests/test_optim_reference.h"

using namespace kiln;
using namespace kiln::optim;
using kiln::testing::optim_ref::from_doubles;
using kiln::testing::optim_ref::values;

namespace {
struct Setup {
  explicit Setup(Device device = Device::cpu(), const GradScalerOptions& options = {.init_scale = 4,
                                                                                    .growth_factor = 2,
                                                                                    .backoff_factor = 0.25,
                                                                                    .growth_interval = 2})
      : scaler(options) {
    w = from_doubles({1, 2, 3, 4}, {4}, DType::f32, device).requires_grad_();
    h = from_doubles({1, -1}, {2}, DType::bf16, device).requires_grad_();
    sgd = std::make_unique<SGD>(std::vector<Tensor>{w, h}, SGDOptions{.lr = 0.5});
  }
  // Gradients as backward of a scaled loss would leave them: value * scale.
  void set_scaled_grads(double value, bool poison = false) {
    const double s = scaler.get_scale();
    w.set_grad(full({4}, value * s, {.device = w.device()}));
    std::vector<double> hv = {value * s, value * s};
    if (poison) hv[1] = std::numeric_limits<double>::infinity();
    h.set_grad(from_doubles(hv, {2}, DType::bf16, h.device()));
  }
  void train_step(double value, bool poison = false) {
    set_scaled_grads(value, poison);
    scaler.step(*sgd);
    scaler.update();
  }
  GradScaler scaler;
  Tensor w, h;
  std::unique_ptr<SGD> sgd;
};
}  // namespace

TEST_CASE("the scale follows torch's growth and backoff sequence") {
  Setup s;
  CHECK(s.scaler.get_scale() == 4);
  std::vector<double> used, after;
  for (int k = 0; k < 3; ++k) {
    used.push_back(s.scaler.get_scale());
    s.train_step(1.0);
    after.push_back(s.scaler.get_scale());
  }
  CHECK(used == std::vector<double>{4, 4, 8});
  CHECK(after == std::vector<double>{4, 8, 8});
  CHECK(s.scaler.growth_tracker().item<int32_t>() == 1);
  s.train_step(1.0, /*poison=*/true);
  CHECK(s.scaler.get_scale() == 2);  // 8 * 0.25
  CHECK(s.scaler.growth_tracker().item<int32_t>() == 0);
  s.train_step(1.0);
  CHECK(s.scaler.get_scale() == 2);
  s.train_step(1.0);
  CHECK(s.scaler.get_scale() == 4);
}

TEST_CASE("unscale_ divides every gradient by the scale and flags inf/NaN") {
  Setup s;
  s.set_scaled_grads(0.75);
  s.scaler.unscale_(*s.sgd);
  CHECK(values(s.w.grad()) == std::vector<double>(4, 0.75));
  CHECK(values(s.h.grad()) == std::vector<double>(2, 0.75));
  CHECK(s.sgd->step_state().found_inf.item<float>() == 0.0f);
  s.sgd->step();
  s.scaler.update();
  // NaN in one element of the bf16 gradient only.
  s.set_scaled_grads(0.5);
  Tensor g = s.h.grad();
  g.copy_(from_doubles({0.5, std::nan("")}, {2}, DType::bf16));
  s.scaler.unscale_(*s.sgd);
  CHECK(s.sgd->step_state().found_inf.item<float>() == 1.0f);
}

TEST_CASE("an inf step changes neither the params nor the step counts nor the schedule") {
  Setup s;
  StepLR schedule(*s.sgd, 1, 0.5);
  s.train_step(1.0);
  schedule.step();
  const std::vector<double> w = values(s.w), h = values(s.h);
  s.train_step(1.0, /*poison=*/true);
  schedule.step();
  CHECK(values(s.w) == w);
  CHECK(values(s.h) == h);
  CHECK(s.sgd->state(0, "step").item<int64_t>() == 1);
  CHECK(s.sgd->step_state().step.item<int64_t>() == 1);
  CHECK(schedule.last_epoch().item<int64_t>() == 1);
  CHECK(s.sgd->lr(0).item<double>() == 0.25);
  s.train_step(1.0);
  schedule.step();
  CHECK(values(s.w) != w);
  CHECK(s.sgd->step_state().step.item<int64_t>() == 2);
  CHECK(s.sgd->lr(0).item<double>() == 0.125);
}

TEST_CASE("with a scaler, clipping acts on unscaled gradients") {
  Setup s(Device::cpu(), {.init_scale = 1024});
  s.set_scaled_grads(1.0);
  s.scaler.unscale_(*s.sgd);
  const auto clip = clip_grad_norm_({s.w, s.h}, 100.0);
  CHECK(clip.total_norm.item<float>() == doctest::Approx(std::sqrt(6.0)));
  CHECK(clip.clip_coef.item<float>() == 1.0f);
  s.scaler.step(*s.sgd);
  s.scaler.update();
  CHECK(values(s.w) == std::vector<double>{0.5, 1.5, 2.5, 3.5});
}

TEST_CASE("scale() multiplies the loss, and backward gives scaled gradients") {
  Setup s;
  Tensor loss = sum(mul(s.w, s.w));
  Tensor scaled = s.scaler.scale(loss);
  CHECK(scaled.item<float>() == 4 * 30.0f);
  scaled.backward();
  CHECK(values(s.w.grad()) == std::vector<double>{8, 16, 24, 32});
}

TEST_CASE("GradScaler state_dict round trips, also before first use") {
  Setup a;
  a.train_step(1.0);
  a.train_step(1.0);
  a.train_step(1.0, true);
  a.train_step(1.0);
  StateDict dict = a.scaler.state_dict();
  dict.meta = nlohmann::json::parse(dict.meta.dump());
  for (auto& [name, t] : dict.tensors) t = t.clone();
  Setup b(Device::cpu(), {});
  b.scaler.load_state_dict(dict);  // before first use: kept until the device is known
  CHECK(b.scaler.get_scale() == a.scaler.get_scale());
  // Saved again before first use (a checkpoint right after a resume): the loaded values, not none.
  const StateDict resaved = b.scaler.state_dict();
  REQUIRE(resaved.tensors.count("scale") == 1);
  CHECK(resaved.tensors.at("scale").item<double>() == a.scaler.get_scale());
  CHECK(resaved.tensors.at("_growth_tracker").item<int32_t>() == a.scaler.growth_tracker().item<int32_t>());
  for (int k = 0; k < 3; ++k) {
    a.train_step(1.0);
    b.train_step(1.0);
    CHECK(b.scaler.get_scale() == a.scaler.get_scale());
    CHECK(b.scaler.growth_tracker().item<int32_t>() == a.scaler.growth_tracker().item<int32_t>());
  }
  CHECK(b.scaler.options().backoff_factor == 0.25);
}

// torch.amp.GradScaler("cpu").state_dict() (torch 2.15) has the keys "scale", "growth_factor",
// "backoff_factor", "growth_interval" and "_growth_tracker".
TEST_CASE("GradScaler state_dict uses torch's keys") {
  Setup a;
  a.train_step(1.0);
  const StateDict dict = a.scaler.state_dict();
  CHECK(dict.tensors.count("scale") == 1);
  REQUIRE(dict.tensors.count("_growth_tracker") == 1);
  CHECK(dict.tensors.at("_growth_tracker").item<int32_t>() == 1);
  for (const char* key : {"growth_factor", "backoff_factor", "growth_interval"}) CHECK(dict.meta.contains(key));

  // A state saved before the rename ("growth_tracker") still loads.
  StateDict legacy = dict;
  legacy.tensors["growth_tracker"] = legacy.tensors.at("_growth_tracker");
  legacy.tensors.erase("_growth_tracker");
  Setup b(Device::cpu(), {});
  b.scaler.load_state_dict(legacy);
  b.train_step(1.0);
  CHECK(b.scaler.get_scale() == 8);  // the loaded tracker (1) reached growth_interval 2
  CHECK(b.scaler.growth_tracker().item<int32_t>() == 0);
}

// torch 2.15: a disabled GradScaler's state_dict() is {}; load_state_dict({}) on an enabled scaler raises
// "The source state dict is empty, possibly because it was saved from a disabled instance of GradScaler.",
// and a disabled scaler's load_state_dict returns at once (it stays disabled).
TEST_CASE("GradScaler.load_state_dict refuses a disabled scaler's state, as torch") {
  Setup a;
  a.train_step(1.0);
  const StateDict dict = a.scaler.state_dict();
  // An enabled scaler refuses a disabled one's state (it would turn loss scaling off) and stays enabled.
  const StateDict disabled = GradScaler({.enabled = false}).state_dict();
  Setup c;
  CHECK_THROWS_WITH_AS(c.scaler.load_state_dict(disabled), doctest::Contains("saved from a disabled instance"), Error);
  CHECK(c.scaler.is_enabled());
  CHECK(c.scaler.get_scale() == 4);
  // A disabled scaler ignores the state it is given.
  GradScaler off({.enabled = false});
  off.load_state_dict(dict);
  CHECK_FALSE(off.is_enabled());
  CHECK(off.get_scale() == 1.0);
}

TEST_CASE("GradScaler misuse is reported") {
  Setup s;
  s.set_scaled_grads(1.0);
  s.scaler.unscale_(*s.sgd);
  CHECK_THROWS_WITH_AS(s.scaler.unscale_(*s.sgd), doctest::Contains("already been called on this optimizer"), Error);
  s.scaler.step(*s.sgd);
  CHECK_THROWS_WITH_AS(s.scaler.step(*s.sgd), doctest::Contains("step() has already been called"), Error);
  CHECK_THROWS_WITH_AS(s.scaler.unscale_(*s.sgd), doctest::Contains("after step()"), Error);
  s.scaler.update();
  CHECK_THROWS_WITH_AS(s.scaler.update(), doctest::Contains("no inf checks were recorded"), Error);
  CHECK_THROWS_WITH_AS(GradScaler({.growth_factor = 0.5}), doctest::Contains("growth_factor must be > 1"), Error);
}

TEST_CASE("a disabled scaler passes through") {
  Setup s(Device::cpu(), {.enabled = false});
  s.w.set_grad(ones({4}));
  s.scaler.step(*s.sgd);
  s.scaler.update();
  CHECK(values(s.w) == std::vector<double>{0.5, 1.5, 2.5, 3.5});
  CHECK(s.scaler.get_scale() == 1.0);
}

// ---------------------------------------------------------------- GPU
TEST_CASE("GradScaler on CUDA matches the CPU without synchronizing [gpu]") {
  KILN_REQUIRE_GPU();
  Setup cpu, gpu(Device::cuda());
  const bool poison[] = {false, false, true, false, false, false};
  for (bool p : poison) {
    cpu.train_step(1.0, p);
    gpu.set_scaled_grads(1.0, p);  // reads the scale (a sync) outside the measured part
    cuda::device_synchronize(0);
    const auto before = cuda::sync_counters();
    gpu.scaler.step(*gpu.sgd);
    gpu.scaler.update();
    const auto after = cuda::sync_counters();
    CHECK(after.device_to_host_copies == before.device_to_host_copies);
    CHECK(after.synchronizations == before.synchronizations);
    CHECK(gpu.scaler.get_scale() == cpu.scaler.get_scale());
  }
  CHECK(values(gpu.w) == values(cpu.w));
  CHECK(values(gpu.h) == values(cpu.h));
}
