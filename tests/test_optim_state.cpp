// Optimizer behaviour beyond the update formulas: state_dict round trips,
// zero_grad, skipped steps, set_lr, the fused clip coefficient, master
// weights, and the error messages.
#include <doctest/doctest.h>

#include "optim/clip_grad.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"
#include "tests/test_optim_reference.h"

using namespace kiln;
using namespace kiln::testing::optim_ref;

namespace {

std::vector<Tensor> make_params(DType dtype, uint64_t seed, Device device = Device::cpu()) {
  std::mt19937_64 rng(seed);
  std::vector<Tensor> params;
  for (int64_t n : {1001, 40, 9}) {
    Tensor p = from_doubles(normals(rng, static_cast<size_t>(n), 0.5), {n}, dtype, device);
    params.push_back(p.requires_grad_());
  }
  return params;
}

std::vector<optim::ParamGroup> two_groups(const std::vector<Tensor>& params) {
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params = {params[0], params[1]};
  groups[1].params = {params[2]};
  return groups;
}

void set_grads(const std::vector<Tensor>& params, std::mt19937_64& rng) {
  for (const Tensor& p : params) {
    p.set_grad(from_doubles(normals(rng, static_cast<size_t>(p.numel()), 1.0), p.shape(), p.dtype(), p.device()));
  }
}

std::vector<Tensor> clones(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.detach().clone().requires_grad_());
  return out;
}

optim::StateDict snapshot(const optim::StateDict& dict) {
  optim::StateDict copy;
  copy.meta = nlohmann::json::parse(dict.meta.dump());  // survives serialization
  for (const auto& [name, t] : dict.tensors) copy.tensors[name] = t.clone();
  return copy;
}

}  // namespace

TEST_CASE("state_dict round trips exactly") {
  for (const Config& c : configs()) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      CAPTURE(std::string(c.label));
      CAPTURE(dtype);
      std::vector<Tensor> a = make_params(dtype, 1);
      auto opt_a = make_optimizer(c, two_groups(a));
      std::mt19937_64 rng(2);
      for (int k = 0; k < 5; ++k) {
        set_grads(a, rng);
        if (k == 1) a[1].set_grad(Tensor());  // param 1 lags one step behind
        opt_a->step();
      }
      const optim::StateDict saved = snapshot(opt_a->state_dict());
      std::vector<Tensor> b = clones(a);
      auto opt_b = make_optimizer(c, two_groups(b));
      opt_b->load_state_dict(saved);
      std::mt19937_64 rng_a(3), rng_b(3);
      for (int k = 0; k < 5; ++k) {
        set_grads(a, rng_a);
        set_grads(b, rng_b);
        opt_a->step();
        opt_b->step();
      }
      for (size_t i = 0; i < a.size(); ++i) CHECK(values(a[i]) == values(b[i]));
      CHECK(opt_b->state(1, "step").item<int64_t>() == 9);
      CHECK(opt_b->step_state().step.item<int64_t>() == 10);
    }
  }
}

TEST_CASE("state_dict names the state like torch.optim") {
  std::vector<Tensor> p = make_params(DType::f32, 1);
  optim::AdamOptions o;
  o.amsgrad = true;
  optim::Adam adam(p, o);
  std::mt19937_64 rng(1);
  set_grads(p, rng);
  adam.step();
  const optim::StateDict dict = adam.state_dict();
  CHECK(dict.meta["optimizer"] == "Adam");
  CHECK(dict.meta["param_groups"].size() == 1);
  CHECK(dict.meta["param_groups"][0]["params"] == nlohmann::json({0, 1, 2}));
  for (const char* name : {"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq", "state.0.max_exp_avg_sq",
                           "group.0.lr", "step"}) {
    CHECK_MESSAGE(dict.tensors.count(name) == 1, name);
  }
  CHECK(dict.tensors.count("state.0.master") == 0);
}

TEST_CASE("load_state_dict rejects mismatched states") {
  std::vector<Tensor> p = make_params(DType::f32, 1);
  optim::SGD sgd(p, {.lr = 0.1, .momentum = 0.9});
  std::mt19937_64 rng(1);
  set_grads(p, rng);
  sgd.step();
  const optim::StateDict dict = sgd.state_dict();

  optim::Adam adam(clones(p), optim::AdamOptions{});
  CHECK_THROWS_WITH_AS(adam.load_state_dict(dict), doctest::Contains("SGD optimizer, this is Adam"), Error);

  optim::SGD two(two_groups(clones(p)), {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH_AS(two.load_state_dict(dict), doctest::Contains("parameter groups"), Error);

  optim::SGD plain(clones(p), {.lr = 0.1});  // no momentum buffer
  CHECK_THROWS_WITH_AS(plain.load_state_dict(dict), doctest::Contains("saved buffers"), Error);

  std::vector<Tensor> other = clones(p);
  other[2] = zeros({4}).requires_grad_();
  optim::SGD shaped(other, {.lr = 0.1, .momentum = 0.9});
  CHECK_THROWS_WITH_AS(shaped.load_state_dict(dict), doctest::Contains("has shape [9]"), Error);
}

TEST_CASE("zero_grad sets gradients to absent or to zeros") {
  std::vector<Tensor> p = make_params(DType::f32, 1);
  optim::SGD sgd(p, {.lr = 0.1});
  std::mt19937_64 rng(1);
  set_grads(p, rng);
  sgd.zero_grad(false);
  CHECK(p[1].grad().defined());
  CHECK(values(p[1].grad()) == std::vector<double>(40, 0.0));
  sgd.zero_grad();
  for (const Tensor& t : p) CHECK_FALSE(t.grad().defined());
  const std::vector<double> before = values(p[0]);
  sgd.step();  // no gradients: nothing changes
  CHECK(values(p[0]) == before);
}

TEST_CASE("a step with found_inf set is skipped and does not count") {
  std::vector<Tensor> p = make_params(DType::bf16, 1);
  optim::AdamW opt(p, optim::AdamWOptions{});
  std::mt19937_64 rng(1);
  set_grads(p, rng);
  opt.step();
  const std::vector<double> before = values(p[0]);
  const std::vector<double> master = values(opt.state(0, "master"));
  const std::vector<double> exp_avg = values(opt.state(0, "exp_avg"));
  opt.step_state().found_inf.fill_(1.0);
  opt.arm_found_inf();
  opt.step();
  CHECK(values(p[0]) == before);
  CHECK(values(opt.state(0, "master")) == master);
  CHECK(values(opt.state(0, "exp_avg")) == exp_avg);
  CHECK(opt.state(0, "step").item<int64_t>() == 1);
  CHECK(opt.step_state().step.item<int64_t>() == 1);
  CHECK(opt.last_step_found_inf().defined());
  // Unarmed, the flag is not consulted.
  opt.step();
  CHECK(values(p[0]) != before);
  CHECK(opt.state(0, "step").item<int64_t>() == 2);
  CHECK_FALSE(opt.last_step_found_inf().defined());
}

TEST_CASE("set_lr changes the device value the kernels read") {
  std::vector<Tensor> p = make_params(DType::f64, 1);
  optim::SGD sgd(two_groups(p), {.lr = 0.1});
  sgd.set_lr(1, 0.5);
  CHECK(sgd.lr(1).item<double>() == 0.5);
  CHECK(sgd.lr(0).item<double>() == 0.1);
  CHECK(sgd.group_options(1).lr == 0.5);
  const std::vector<double> before = values(p[2]);
  p[2].set_grad(ones({9}, {.dtype = DType::f64}));
  sgd.step();
  const std::vector<double> after = values(p[2]);
  for (size_t i = 0; i < before.size(); ++i) CHECK(after[i] == doctest::Approx(before[i] - 0.5).epsilon(1e-12));
}

TEST_CASE("the fused clip coefficient equals clip_grad_norm_ then step") {
  for (const Config& c : configs()) {
    CAPTURE(std::string(c.label));
    std::vector<Tensor> a = make_params(DType::f32, 4), b = clones(a);
    auto opt_a = make_optimizer(c, two_groups(a));
    auto opt_b = make_optimizer(c, two_groups(b));
    std::mt19937_64 rng_a(5), rng_b(5);
    for (int k = 0; k < 3; ++k) {
      set_grads(a, rng_a);
      set_grads(b, rng_b);
      const auto fused = opt_a->clip_grad_norm_(1.0);
      const auto plain = optim::clip_grad_norm_(b, 1.0);
      CHECK(fused.total_norm.item<float>() == plain.total_norm.item<float>());
      CHECK(fused.clip_coef.item<float>() < 1.0f);
      opt_a->step();
      opt_b->step();
      for (size_t i = 0; i < a.size(); ++i) {
        // Not bitwise: the compiler may contract g * coef + wd * p into an FMA
        // differently in the two paths, and Adam's first step is sign(g) * lr.
        CHECK(worst_ratio(values(a[i]), values(b[i]), 1e-5, 1e-6) <= 1.0);
      }
    }
  }
}

TEST_CASE("non-contiguous gradients are made contiguous") {
  Tensor w = from_doubles({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32).requires_grad_();
  optim::SGD sgd({w}, {.lr = 1.0});
  Tensor g = from_doubles({1, 2, 3, 4, 5, 6}, {3, 2}, DType::f32).t();  // (2, 3), transposed strides
  REQUIRE_FALSE(g.is_contiguous());
  w.set_grad(g);
  sgd.step();
  CHECK(values(w) == std::vector<double>{0, -1, -2, 2, 1, 0});  // w - g with g = [[1, 3, 5], [2, 4, 6]]
}

TEST_CASE("sync_master_weights reloads masters from the params") {
  std::vector<Tensor> p = make_params(DType::f16, 1);
  optim::SGD sgd(p, {.lr = 0.1});
  std::mt19937_64 rng(1);
  set_grads(p, rng);
  sgd.step();
  {
    NoGradGuard no_grad;
    p[1].fill_(2.0);
  }
  sgd.sync_master_weights();
  CHECK(values(sgd.state(1, "master")) == std::vector<double>(40, 2.0));
}

TEST_CASE("optimizer errors name the problem") {
  Tensor a = zeros({3}).requires_grad_(), b = zeros({2}).requires_grad_();
  CHECK_THROWS_WITH_AS(optim::SGD({a, a}, {.lr = 0.1}), doctest::Contains("appears more than once"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD(std::vector<Tensor>{}, {.lr = 0.1}), doctest::Contains("empty parameter list"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({a}, {.lr = -1}), doctest::Contains("invalid learning rate -1"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({a}, {.lr = 0.1, .nesterov = true}), doctest::Contains("Nesterov"), Error);
  CHECK_THROWS_WITH_AS(optim::SGD({zeros({3}, {.dtype = DType::i32})}, {.lr = 0.1}),
                       doctest::Contains("has dtype int32"), Error);
  optim::AdamOptions bad;
  bad.beta1 = 1.0;
  CHECK_THROWS_WITH_AS(optim::Adam({a}, bad), doctest::Contains("invalid beta1 1"), Error);
  optim::AdamOptions bad2;
  bad2.beta2 = -0.1;
  CHECK_THROWS_WITH_AS(optim::Adam({a}, bad2), doctest::Contains("invalid beta2"), Error);

  b.set_name("fc.bias");
  optim::Adam adam({a, b}, optim::AdamOptions{});
  // A gradient of another dtype is refused where it is assigned (torch: "assigned grad has data of a
  // different type"), so the step never sees one.
  CHECK_THROWS_WITH_AS(b.set_grad(zeros({2}, {.dtype = DType::f64})),
                       doctest::Contains("float64 on cpu for a tensor of shape [2], float32"), Error);
  CHECK_FALSE(b.grad().defined());
  CHECK_THROWS_WITH_AS(adam.lr(5), doctest::Contains("no parameter group 5"), Error);
}

// ---------------------------------------------------------------- GPU
TEST_CASE("state_dict moves between CPU and CUDA [gpu]") {
  KILN_REQUIRE_GPU();
  const Config c = configs()[5];  // AdamW
  std::vector<Tensor> a = make_params(DType::f32, 1, Device::cuda());
  auto opt_a = make_optimizer(c, two_groups(a));
  std::mt19937_64 rng(2);
  set_grads(a, rng);
  opt_a->step();
  optim::StateDict saved = opt_a->state_dict();
  for (auto& [name, t] : saved.tensors) t = t.cpu();
  std::vector<Tensor> b;
  for (const Tensor& t : a) b.push_back(t.detach().clone().requires_grad_());
  auto opt_b = make_optimizer(c, two_groups(b));
  opt_b->load_state_dict(saved);
  std::mt19937_64 rng_a(3), rng_b(3);
  set_grads(a, rng_a);
  set_grads(b, rng_b);
  opt_a->step();
  opt_b->step();
  for (size_t i = 0; i < a.size(); ++i) CHECK(values(a[i]) == values(b[i]));
}
