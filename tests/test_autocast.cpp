// Autocast (core/autocast.h) on the CPU in bfloat16: the three op policies,
// gradients reaching float32 parameters in float32, the weight cache, guard
// nesting and restoration, the float16-on-CPU refusal, and a small MLP whose
// bf16-autocast training follows its float32 twin.
#include <cmath>
#include <functional>
#include <iomanip>
#include <memory>
#include <vector>

#include "core/autocast.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {

constexpr DeviceType kCpu = DeviceType::cpu;

// A value rounded to bfloat16 and back, as autocast's cast of an input does.
Tensor bf16_rounded(const Tensor& x) { return x.detach().to(DType::bf16).to(DType::f32); }

Tensor parameter(const Shape& shape) { return randn(shape).requires_grad_(); }

// The graph node that input `index` of `out`'s op came from.
std::shared_ptr<autograd::Node> input_node(const Tensor& out, size_t index) {
  REQUIRE(out.grad_fn() != nullptr);
  REQUIRE(out.grad_fn()->next_edges.size() > index);
  return out.grad_fn()->next_edges[index].node;
}

}  // namespace

TEST_CASE("linear runs in bf16 under autocast; parameters and their gradients stay float32") {
  manual_seed(11);
  Tensor x = parameter({8, 16}), w = parameter({4, 16}), b = parameter({4});
  const Tensor reference = linear(x.detach(), w.detach(), b.detach());
  Tensor y, loss;
  {
    AutocastGuard autocast(kCpu, DType::bf16);
    y = linear(x, w, b);
    loss = sum(y);  // float32 policy: the loss comes back in float32
  }
  CHECK(y.dtype() == DType::bf16);
  CHECK(loss.dtype() == DType::f32);
  // Exact up to the output's rounding against the product of the rounded inputs,
  KILN_CHECK_CLOSE(y.to(DType::f32), linear(bf16_rounded(x), bf16_rounded(w), bf16_rounded(b)), 1.6e-2, 1e-5);
  // and within bf16 input rounding of the float32 result.
  KILN_CHECK_CLOSE(y.to(DType::f32), reference, 1.6e-2, 3e-2);

  loss.backward();
  for (const Tensor* t : {&x, &w, &b}) {
    CHECK(t->dtype() == DType::f32);
    REQUIRE(t->grad().defined());
    CHECK(t->grad().dtype() == DType::f32);
  }
  // d sum(x W^T + b): dW rows are the column sums of x, dx rows the column sums of W, db = batch size.
  KILN_CHECK_CLOSE(w.grad(), sum(x.detach(), {0}, true).expand({4, 16}), 2e-2, 2e-2);
  KILN_CHECK_CLOSE(x.grad(), sum(w.detach(), {0}, true).expand({8, 16}), 2e-2, 2e-2);
  KILN_CHECK_CLOSE(b.grad(), full({4}, 8.0), 0, 0);
}

TEST_CASE("matmul, mm, bmm and conv2d run in bf16 under autocast") {
  manual_seed(12);
  const Tensor a = randn({3, 5, 7}), c = randn({3, 7, 2}), m = randn({5, 7}), n = randn({7, 2});
  const Tensor image = randn({2, 3, 6, 6}), filters = parameter({4, 3, 3, 3}), bias = parameter({4});
  // References in float32 from the rounded inputs, computed before autocast is on.
  const Tensor batched_ref = bmm(bf16_rounded(a), bf16_rounded(c));
  const Tensor product_ref = matmul(bf16_rounded(a), bf16_rounded(n));
  const Tensor plain_ref = mm(bf16_rounded(m), bf16_rounded(n));
  const Tensor conv_ref = conv2d(bf16_rounded(image), bf16_rounded(filters), bf16_rounded(bias), 1, 1);
  Tensor batched, product, plain, out;
  {
    AutocastGuard autocast(kCpu, DType::bf16);
    batched = bmm(a, c);
    product = matmul(a, n);
    plain = mm(m, n);
    // The CPU conv kernel computes 16-bit inputs in float32: autocast must not cast those back.
    out = conv2d(image, filters, bias, 1, 1);
  }
  const std::vector<std::pair<Tensor, Tensor>> results = {
      {batched, batched_ref}, {product, product_ref}, {plain, plain_ref}, {out, conv_ref}};
  for (size_t i = 0; i < results.size(); ++i) {
    CAPTURE(i);
    CHECK(results[i].first.dtype() == DType::bf16);
    KILN_CHECK_CLOSE(results[i].first.to(DType::f32), results[i].second, 1.6e-2, 1e-5);
  }
  sum(out.to(DType::f32)).backward();
  REQUIRE(filters.grad().defined());
  CHECK(filters.grad().dtype() == DType::f32);
  CHECK(bias.grad().dtype() == DType::f32);
  KILN_CHECK_CLOSE(bias.grad(), full({4}, 2.0 * 36.0), 0, 0);  // each of the 2 x 6 x 6 outputs counts once
}

TEST_CASE("softmax, losses, norms, reductions and exp/log/pow run in float32 under autocast") {
  manual_seed(13);
  const Tensor logits = randn({6, 5}).to(DType::bf16);
  const Tensor up = logits.to(DType::f32);  // exact: bf16 -> float32 loses nothing
  const Tensor target = tensor<int64_t>({0, 4, 2, 1, 3, 0}, {6});
  const Tensor ln_weight = ones({5}), ln_bias = zeros({5});
  AutocastGuard autocast(kCpu, DType::bf16);
  const std::vector<std::pair<Tensor, Tensor>> results = {
      {softmax(logits, 1), softmax(up, 1)},
      {log_softmax(logits, 1), log_softmax(up, 1)},
      {cross_entropy(logits, target), cross_entropy(up, target)},
      {nll_loss(log_softmax(logits, 1), target), nll_loss(log_softmax(up, 1), target)},
      {layer_norm(logits, {5}, ln_weight, ln_bias), layer_norm(up, {5}, ln_weight, ln_bias)},
      {sum(logits), sum(up)},
      {mean(logits, {1}), mean(up, {1})},
      {norm(logits), norm(up)},
      {exp(logits), exp(up)},
      {log(abs(logits)), log(abs(up))},
      {pow(logits, 2.0), pow(up, 2.0)},
  };
  for (size_t i = 0; i < results.size(); ++i) {
    CAPTURE(i);
    CHECK(results[i].first.dtype() == DType::f32);
    KILN_CHECK_CLOSE(results[i].first, results[i].second, 1e-6, 1e-6);
  }
  // float64 is never cast down, not even by the lower-precision ops.
  const Tensor wide = randn({4, 4}, {.dtype = DType::f64});
  CHECK(softmax(wide, 0).dtype() == DType::f64);
  CHECK(mm(wide, wide).dtype() == DType::f64);
}

// cross_entropy under autocast reads bfloat16 logits as they are (no float32
// copy); the loss and the gradient must be those of the cast, bit for bit.
TEST_CASE("cross_entropy takes 16-bit logits under autocast without a float32 copy, as the cast would") {
  manual_seed(29);
  const int64_t rows = 37, classes = 301;
  const Tensor base = mul(randn({rows, classes}), 4.0).requires_grad_();
  std::vector<int64_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r) labels[r] = (r * 7919) % classes;
  labels[5] = -100;  // ignored
  const Tensor target = tensor<int64_t>(labels, {rows});
  const Tensor row_scale = randn({rows});  // an upstream gradient per row, for reduction none
  for (const Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (const double smoothing : {0.0, 0.1}) {
      CAPTURE(static_cast<int>(reduction));
      CAPTURE(smoothing);
      const auto run = [&](bool fused) {
        base.set_grad(Tensor());
        const Tensor logits = base.to(DType::bf16);  // outside autocast: a recorded cast
        Tensor loss;
        if (fused) {
          AutocastGuard autocast(kCpu, DType::bf16);
          loss = cross_entropy(logits, target, Tensor(), -100, smoothing, reduction);
          CHECK(loss.grad_fn()->name() == "cross_entropy");
          CHECK(input_node(loss, 0) == logits.grad_fn());  // no cast in between
        } else {
          loss = cross_entropy(logits.to(DType::f32), target, Tensor(), -100, smoothing, reduction);
        }
        CHECK(loss.dtype() == DType::f32);
        const Tensor scalar = reduction == Reduction::none ? sum(mul(loss, row_scale)) : mul(loss, 3.0);
        scalar.backward();
        return std::pair{loss.detach(), base.grad()};
      };
      const auto [fused_loss, fused_grad] = run(true);
      const auto [cast_loss, cast_grad] = run(false);
      CHECK(fused_loss.to_vector<float>() == cast_loss.to_vector<float>());
      CHECK(fused_grad.to_vector<float>() == cast_grad.to_vector<float>());
    }
  }
  // With class weights the logits are still cast (one dtype for logits and weights in the kernels).
  const Tensor weight = add(rand({classes}), 0.5);
  AutocastGuard autocast(kCpu, DType::bf16);
  const Tensor logits = base.detach().to(DType::bf16);
  const Tensor weighted = cross_entropy(logits, target, weight);
  CHECK(weighted.dtype() == DType::f32);
  KILN_CHECK_CLOSE(weighted, cross_entropy(logits.to(DType::f32), target, weight), 1e-6, 1e-6);
}

TEST_CASE("ops with inputs of different floating dtypes promote to the widest under autocast") {
  manual_seed(14);
  const Tensor low = randn({3, 4}).to(DType::bf16), high = randn({4});
  CHECK_THROWS_AS(add(low, high), Error);  // outside autocast mixed dtypes are an error
  AutocastGuard autocast(kCpu, DType::bf16);
  const Tensor total = add(low, high), product = mul(low, high), chosen = where(gt(high, 0.0), low, high);
  CHECK(total.dtype() == DType::f32);
  CHECK(product.dtype() == DType::f32);
  CHECK(chosen.dtype() == DType::f32);
  KILN_CHECK_CLOSE(total, add(low.to(DType::f32), high), 0, 0);
  KILN_CHECK_CLOSE(product, mul(low.to(DType::f32), high), 0, 0);
  CHECK(add(low, low).dtype() == DType::bf16);  // one dtype: nothing to promote
}

// A float32 residual plus a 16-bit branch (a transformer block under
// autocast) is one kernel, with the promote's values and gradients.
TEST_CASE("add and sub of float32 and 16-bit tensors under autocast run in one pass, as the cast would") {
  manual_seed(15);
  const Tensor residual_base = randn({5, 4, 6}).requires_grad_(), branch_base = randn({5, 4, 6}).requires_grad_();
  const Tensor row_base = randn({6}).requires_grad_();
  const Tensor upstream = randn({5, 4, 6});
  struct Case {
    const char* what;
    std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> op;  // (residual f32, branch bf16, row bf16)
  };
  const std::vector<Case> cases = {
      {"f32 + bf16", [](const Tensor& r, const Tensor& b, const Tensor&) { return add(r, b); }},
      {"bf16 + f32", [](const Tensor& r, const Tensor& b, const Tensor&) { return add(b, r); }},
      {"f32 - 2 bf16", [](const Tensor& r, const Tensor& b, const Tensor&) { return sub(r, b, 2.0); }},
      {"f32 + broadcast bf16 row", [](const Tensor& r, const Tensor&, const Tensor& w) { return add(r, w); }},
      {"transposed f32 + bf16", [](const Tensor& r, const Tensor& b, const Tensor&) {
         return add(r.transpose(0, 1), b.transpose(0, 1));
       }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const auto run = [&](bool fused) {
      for (const Tensor& t : {residual_base, branch_base, row_base}) t.set_grad(Tensor());
      const Tensor residual = mul(residual_base, 1.0);  // float32, recorded
      const Tensor branch = branch_base.to(DType::bf16), row = row_base.to(DType::bf16);
      Tensor out;
      if (fused) {
        AutocastGuard autocast(kCpu, DType::bf16);
        out = c.op(residual, branch, row);
        const auto node = out.grad_fn();
        REQUIRE(node != nullptr);
        for (const auto& edge : node->next_edges) {  // no cast of its own between the op and its inputs
          REQUIRE(edge.node != nullptr);
          const std::string name = edge.node->name();
          CHECK(((name != "to" && name != "cast") || edge.node == branch.grad_fn() || edge.node == row.grad_fn()));
        }
      } else {
        out = c.op(residual, branch.to(DType::f32), row.to(DType::f32));
      }
      CHECK(out.dtype() == DType::f32);
      sum(mul(out, upstream.reshape(out.shape()))).backward();
      return std::vector<std::vector<float>>{out.detach().contiguous().to_vector<float>(),
                                             residual_base.grad().to_vector<float>(),
                                             branch_base.grad().defined() ? branch_base.grad().to_vector<float>()
                                                                          : std::vector<float>{},
                                             row_base.grad().defined() ? row_base.grad().to_vector<float>()
                                                                       : std::vector<float>{}};
    };
    CHECK(run(true) == run(false));  // values and every gradient, bit for bit
  }
}

TEST_CASE("cat and stack promote to the widest floating dtype under autocast (a ViT's class token)") {
  manual_seed(15);
  const Tensor patches = randn({2, 3, 4}).to(DType::bf16), token = randn({2, 1, 4});
  CHECK_THROWS_AS(cat({token, patches}, 1), Error);  // outside autocast mixed dtypes are an error
  AutocastGuard autocast(kCpu, DType::bf16);
  const Tensor joined = cat({token, patches}, 1);
  CHECK(joined.dtype() == DType::f32);
  KILN_CHECK_CLOSE(joined, cat({token, patches.to(DType::f32)}, 1), 0, 0);
  const Tensor stacked = stack({token.squeeze(1), patches.narrow(1, 0, 1).squeeze(1)}, 0);
  CHECK(stacked.dtype() == DType::f32);
  CHECK(cat({patches, patches}, 1).dtype() == DType::bf16);  // one dtype: nothing to promote
}

TEST_CASE("scaled_dot_product_attention runs in bf16 under CPU autocast, computed in float32") {
  manual_seed(16);
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 5, 8}), v = randn({1, 2, 5, 8});
  Tensor out;
  {
    AutocastGuard autocast(kCpu, DType::bf16);
    out = scaled_dot_product_attention(q, k, v, Tensor(), 0.0, /*is_causal=*/true);  // recursed without end
  }
  CHECK(out.dtype() == DType::bf16);
  const Tensor expected = scaled_dot_product_attention(q.to(DType::bf16).to(DType::f32), k.to(DType::bf16).to(DType::f32),
                                                       v.to(DType::bf16).to(DType::f32), Tensor(), 0.0, true);
  KILN_CHECK_CLOSE(out.to(DType::f32), expected, 1e-2, 1e-2);
}

TEST_CASE("the weight cache casts a parameter once per autocast region") {
  manual_seed(15);
  Tensor w = parameter({3, 8});
  const Tensor x = randn({5, 8});  // an activation: not a parameter, never cached
  Tensor y1, y2, loss;
  {
    AutocastGuard autocast(kCpu, DType::bf16);
    CHECK(autocast::weight_cache_size() == 0);
    y1 = linear(x, w);
    y2 = linear(x, w);
    CHECK(autocast::weight_cache_size() == 1);
    // Both products read the same cast tensor: one cast node feeds both.
    const auto cast_node = input_node(y1, 1);
    REQUIRE(cast_node != nullptr);
    CHECK(cast_node->name() == "cast");
    CHECK(input_node(y2, 1) == cast_node);
    const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&w});
    REQUIRE(to);
    CHECK(to(w).same(to(w)));
    loss = add(sum(y1), sum(y2));
  }
  CHECK(autocast::weight_cache_size() == 0);  // cleared by the outermost guard
  loss.backward();
  CHECK(w.grad().dtype() == DType::f32);
  KILN_CHECK_CLOSE(w.grad(), mul(sum(x, {0}, true).expand({3, 8}), 2.0), 2e-2, 2e-2);
}

TEST_CASE("the weight cache does not serve stale or graph-less casts") {
  manual_seed(16);
  Tensor w = parameter({2, 4});
  const Tensor x = ones({1, 4});
  AutocastGuard autocast(kCpu, DType::bf16);
  const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&w});
  const Tensor before = to(w);
  {
    NoGradGuard no_grad;
    w.mul_(2.0);  // an in-place update inside the region (as an optimizer step would be)
  }
  const Tensor after = to(w);
  CHECK_FALSE(after.same(before));
  KILN_CHECK_CLOSE(after.to(DType::f32), mul(before.to(DType::f32), 2.0), 0, 0);

  // A cast made under no_grad has no graph node: a later use with gradients must get a recorded one.
  Tensor unrecorded;
  {
    NoGradGuard no_grad;
    w.mul_(0.5);  // back to the initial values; the new version makes this region cast w again, here
    unrecorded = linear(x, w);
  }
  CHECK(unrecorded.grad_fn() == nullptr);
  CHECK(autocast::weight_cache_size() == 1);
  const Tensor recorded = linear(x, w);
  REQUIRE(input_node(recorded, 1) != nullptr);
  sum(recorded).backward();
  REQUIRE(w.grad().defined());
  KILN_CHECK_CLOSE(w.grad(), ones({2, 4}), 0, 0);
}

TEST_CASE("guards restore the previous state and nest; enabled=false turns autocast off") {
  manual_seed(17);
  const Tensor x = randn({2, 3}), w = randn({4, 3});
  Tensor p = parameter({4, 3});
  CHECK_FALSE(autocast_enabled(kCpu));
  CHECK(autocast_dtype(kCpu) == DType::bf16);   // PyTorch's defaults
  CHECK(autocast_dtype(DeviceType::cuda) == DType::f16);
  {
    AutocastGuard outer(kCpu, DType::bf16);
    CHECK(autocast_enabled(kCpu));
    CHECK_FALSE(autocast_enabled(DeviceType::cuda));  // per device type
    CHECK(linear(x, w).dtype() == DType::bf16);
    (void)linear(x, p);
    CHECK(autocast::weight_cache_size() == 1);
    {
      AutocastGuard inner(kCpu, DType::bf16, /*enabled=*/false);
      CHECK_FALSE(autocast_enabled(kCpu));
      CHECK(linear(x, w).dtype() == DType::f32);
      CHECK(softmax(x.to(DType::bf16), 1).dtype() == DType::bf16);
    }
    CHECK(autocast_enabled(kCpu));
    CHECK(autocast::weight_cache_size() == 1);  // an inner guard's exit keeps the region's cache
    CHECK(linear(x, w).dtype() == DType::bf16);
  }
  CHECK_FALSE(autocast_enabled(kCpu));
  CHECK(autocast::weight_cache_size() == 0);
  CHECK(linear(x, w).dtype() == DType::f32);
  CHECK(softmax(x.to(DType::bf16), 1).dtype() == DType::bf16);
}

TEST_CASE("float16 autocast is refused on the CPU; a CUDA guard leaves CPU ops alone") {
  CHECK_THROWS_WITH_AS(AutocastGuard(kCpu, DType::f16), doctest::Contains("needs a GPU"), Error);
  CHECK_THROWS_WITH_AS(AutocastGuard(kCpu, DType::f32), doctest::Contains("float16 or bfloat16"), Error);
  CHECK_FALSE(autocast_enabled(kCpu));  // a refused guard changed nothing
  AutocastGuard cuda_only(DeviceType::cuda, DType::f16);
  CHECK(autocast_enabled(DeviceType::cuda));
  CHECK(autocast_dtype(DeviceType::cuda) == DType::f16);
  CHECK(linear(ones({2, 3}), ones({4, 3})).dtype() == DType::f32);
}

namespace {

struct MlpRun {
  double first_loss = 0, last_loss = 0;
  DType logits_dtype = DType::f32;
  DType weight_dtype = DType::bf16, grad_dtype = DType::bf16;
};

// 50 full-batch AdamW steps of a 16-64-4 MLP on a teacher-labelled problem,
// with or without bf16 autocast, from the same initial weights and data.
MlpRun train_mlp(bool autocast_on) {
  manual_seed(18);
  const Tensor inputs = randn({256, 16}), teacher = randn({16, 4});
  const Tensor labels = argmax(matmul(inputs, teacher), 1);
  nn::Sequential model({std::make_shared<nn::Linear>(16, 64), std::make_shared<nn::ReLU>(),
                        std::make_shared<nn::Linear>(64, 4)});
  optim::AdamWOptions options;
  options.lr = 1e-2;
  optim::AdamW adamw(model.parameters(), options);
  MlpRun run;
  for (int step = 0; step < 50; ++step) {
    Tensor loss;
    {
      AutocastGuard autocast(kCpu, DType::bf16, autocast_on);
      const Tensor logits = model.forward(inputs);
      run.logits_dtype = logits.dtype();
      loss = cross_entropy(logits, labels);
    }
    loss.backward();
    const double value = loss.item<double>();
    if (step == 0) run.first_loss = value;
    run.last_loss = value;
    run.grad_dtype = model.parameters()[0].grad().dtype();
    adamw.step();
    adamw.zero_grad();
  }
  run.weight_dtype = model.parameters()[0].dtype();
  return run;
}

}  // namespace

TEST_CASE("an MLP trained 50 steps in bf16 autocast reaches the float32 loss") {
  const MlpRun fp32 = train_mlp(false), mixed = train_mlp(true);
  MESSAGE(std::setprecision(8) << "loss at step 0: float32 " << fp32.first_loss << ", bf16 autocast "
                                << mixed.first_loss << "; after 50 steps: float32 " << fp32.last_loss
                                << ", bf16 autocast " << mixed.last_loss);
  CHECK(fp32.logits_dtype == DType::f32);
  CHECK(mixed.logits_dtype == DType::bf16);
  CHECK(mixed.weight_dtype == DType::f32);
  CHECK(mixed.grad_dtype == DType::f32);
  CHECK(std::abs(mixed.first_loss - fp32.first_loss) < 0.02 * fp32.first_loss);
  CHECK(fp32.last_loss < 0.3 * fp32.first_loss);  // the problem is learnable in 50 steps
  CHECK(std::abs(mixed.last_loss - fp32.last_loss) < 0.1 * fp32.last_loss + 0.005);
}

}  // namespace kiln::testing
