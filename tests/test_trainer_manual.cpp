// Manual optimization (automatic_optimization = false) with several
// optimizers: Lightning's toggle semantics, global steps per optimizer step,
// the seed documents' GAN loop with accumulation, and the refusals.
#include <doctest/doctest.h>

#include <filesystem>

#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "optim/lr_scheduler.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

TrainerOptions quiet_options() {
  TrainerOptions options =
      testing::quiet_trainer_options(fs::temp_directory_path() / ("kiln_manual_" + std::to_string(::getpid())));
  options.logger = false;
  options.enable_checkpointing = false;
  return options;
}

std::unique_ptr<optim::SGD> sgd(std::vector<Tensor> params, double lr, double momentum = 0) {
  return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = lr, .momentum = momentum});
}

// a: optimizer 0 only; b: optimizer 1 only; shared: both; frozen: optimizer 1, requires_grad false throughout.
struct FourParams : nn::Module {
  Tensor a, b, shared, frozen;
  FourParams() {
    a = register_parameter("a", full({2}, 1.0));
    b = register_parameter("b", full({2}, 2.0));
    shared = register_parameter("shared", full({2}, 3.0));
    frozen = register_parameter("frozen", full({2}, 4.0), /*requires_grad=*/false);
  }
  std::string type_name() const override { return "FourParams"; }
};

struct Toggling : TrainModule {
  Toggling() { automatic_optimization = false; }
  nn::Module& model() override { return params; }
  OptimizerConfigs configure_optimizers() override {
    return {OptimizerConfig{sgd({params.a, params.shared}, 0.1)},
            OptimizerConfig{sgd({params.b, params.shared, params.frozen}, 0.1)}};
  }
  Tensor training_step(const Batch&, int64_t) override {
    auto [opt0, opt1] = optimizers<2>();
    CHECK(optimizers().size() == 2);
    {
      auto toggled = opt1.toggle_model();
      inside = {params.a.requires_grad(), params.b.requires_grad(), params.shared.requires_grad(),
                params.frozen.requires_grad()};
      manual_backward(sum(params.a * params.b * params.shared) + sum(params.frozen));
      grads = {params.a.grad().defined(), params.b.grad().defined(), params.shared.grad().defined()};
      opt1.step();
      opt1.zero_grad();
    }
    after = {params.a.requires_grad(), params.b.requires_grad(), params.shared.requires_grad(),
             params.frozen.requires_grad()};
    toggle_optimizer(opt0);
    toggled_other = {params.a.requires_grad(), params.b.requires_grad(), params.shared.requires_grad()};
    untoggle_optimizer(opt0);
    untoggled_other = params.b.requires_grad();
    steps_seen = trainer()->global_step();
    return Tensor();
  }
  FourParams params;
  std::vector<bool> inside, grads, after, toggled_other;
  bool untoggled_other = false;
  int64_t steps_seen = -1;
};

std::shared_ptr<TensorDataset> one_example() {
  return std::make_shared<TensorDataset>(zeros({1, 1}), zeros({1, 1}));
}

// A small GAN: G maps noise (the target column pair) to 3 features, D scores them.
struct TinyGan : TrainModule {
  explicit TinyGan(bool toggle = true) : toggle(toggle) {
    automatic_optimization = false;
    manual_seed(21);
    generator = nets.register_module("generator", std::make_shared<nn::Linear>(2, 3));
    discriminator = nets.register_module("discriminator", std::make_shared<nn::Linear>(3, 1));
  }
  struct Nets : nn::Module {
    std::string type_name() const override { return "TinyGanNets"; }
  };
  nn::Module& model() override { return nets; }
  OptimizerConfigs configure_optimizers() override {
    optim::AdamOptions adam;
    adam.lr = 0.01;
    return {OptimizerConfig{sgd(generator->parameters(), 0.05, 0.9)},
            OptimizerConfig{std::make_unique<optim::Adam>(discriminator->parameters(), adam)}};
  }
  static Tensor square_mean(const Tensor& x) { return mean(x * x); }
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    auto [g_opt, d_opt] = optimizers<2>();
    // Sync and step at the end of each accumulation of two batches, or of the epoch.
    const bool last = (batch_idx + 1) % 2 == 0 || trainer()->is_last_batch();
    Tensor fake = generator->forward(batch.target);
    Tensor d_loss, g_loss;
    {
      std::optional<ToggledModel> toggled;
      if (toggle) toggled.emplace(d_opt.toggle_model(last));
      d_loss = square_mean(discriminator->forward(batch.input) - 1.0) +
               square_mean(discriminator->forward(fake.detach()));
      manual_backward(d_loss);
      check_sync(last);
      if (last) {
        d_opt.step();
        d_opt.zero_grad();
      }
    }
    {
      std::optional<ToggledModel> toggled;
      if (toggle) toggled.emplace(g_opt.toggle_model(last));
      g_loss = square_mean(discriminator->forward(fake) - 1.0);
      manual_backward(g_loss);
      check_sync(last);
      if (last) {
        g_opt.step();
        g_opt.zero_grad();
      }
    }
    log("g_loss", g_loss, std::nullopt, true);
    log("d_loss", d_loss, std::nullopt, true);
    return Tensor();
  }
  // With DDP: a backward inside toggle_model(sync_grad=false) starts no gradient synchronization.
  void check_sync(bool sync) {
    if (nn::DistributedDataParallel* ddp = trainer()->ddp()) {
      if (ddp->gradient_sync_pending() != sync) ++sync_errors;
    }
  }
  bool toggle;
  Nets nets;
  std::shared_ptr<nn::Linear> generator, discriminator;
  int sync_errors = 0;
};

std::vector<float> values(const nn::Module& model) {
  std::vector<float> out;
  for (const Tensor& p : model.parameters()) {
    for (float v : p.to_vector<float>()) out.push_back(v);
  }
  return out;
}

// The same updates as TinyGan under the Trainer, written out by hand.
std::vector<float> hand_written_gan(const std::shared_ptr<TensorDataset>& data, int64_t batch_size, int epochs) {
  TinyGan gan;
  OptimizerConfigs configs = gan.configure_optimizers();
  optim::Optimizer& g_opt = *configs.configs[0].optimizer;
  optim::Optimizer& d_opt = *configs.configs[1].optimizer;
  auto set_requires_grad = [](nn::Module& module, bool on) {
    for (Tensor p : module.parameters()) p.requires_grad_(on);
  };
  DataLoader loader(data, DataLoaderOptions{.batch_size = batch_size, .shuffle = true, .seed = 9});
  for (int epoch = 0; epoch < epochs; ++epoch) {
    loader.set_epoch(epoch);
    int64_t index = 0;
    while (std::optional<Batch> batch = loader.next()) {
      const bool last = (index + 1) % 2 == 0 || index + 1 == loader.size();
      Tensor fake = gan.generator->forward(batch->target);
      set_requires_grad(*gan.generator, false);
      (TinyGan::square_mean(gan.discriminator->forward(batch->input) - 1.0) +
       TinyGan::square_mean(gan.discriminator->forward(fake.detach())))
          .backward();
      if (last) {
        d_opt.step();
        d_opt.zero_grad();
      }
      set_requires_grad(*gan.generator, true);
      set_requires_grad(*gan.discriminator, false);
      TinyGan::square_mean(gan.discriminator->forward(fake) - 1.0).backward();
      if (last) {
        g_opt.step();
        g_opt.zero_grad();
      }
      set_requires_grad(*gan.discriminator, true);
      ++index;
    }
  }
  return values(gan.nets);
}

std::shared_ptr<TensorDataset> gan_data() {
  manual_seed(5);
  return std::make_shared<TensorDataset>(add(randn({10, 3}), 2.0), randn({10, 2}));
}

}  // namespace

TEST_CASE("Manual optimization: toggle_model freezes only the other optimizers' own parameters") {
  Toggling module;
  TrainerOptions options = quiet_options();
  options.max_epochs = 1;
  DataLoader loader(one_example(), DataLoaderOptions{.batch_size = 1});
  Trainer trainer(options);
  trainer.fit(module, loader);
  // Inside opt1's toggle: a (optimizer 0 only) frozen; b, shared on; frozen stays off.
  CHECK(module.inside == std::vector<bool>{false, true, true, false});
  CHECK(module.grads == std::vector<bool>{false, true, true});
  CHECK(module.after == std::vector<bool>{true, true, true, false});
  CHECK(module.toggled_other == std::vector<bool>{true, false, true});
  CHECK(module.untoggled_other);
  // One optimizer step, counted as a global step; only opt1's parameters moved.
  CHECK(module.steps_seen == 1);
  CHECK(trainer.global_step() == 1);
  CHECK(module.params.a.to_vector<float>() == std::vector<float>{1, 1});
  KILN_CHECK_CLOSE(module.params.b, full({2}, 2.0 - 0.1 * 3.0), 1e-6, 1e-6);       // b -= lr * a * shared
  KILN_CHECK_CLOSE(module.params.shared, full({2}, 3.0 - 0.1 * 2.0), 1e-6, 1e-6);  // shared -= lr * a * b
}

TEST_CASE("Manual optimization: the GAN loop with accumulation every 2 batches equals the hand-written loop") {
  auto data = gan_data();
  const std::vector<float> expected = hand_written_gan(data, 2, 2);
  TrainerOptions options = quiet_options();
  options.max_epochs = 2;
  auto run = [&](bool toggle, int64_t* steps) {
    TinyGan gan(toggle);
    DataLoader loader(data, DataLoaderOptions{.batch_size = 2, .shuffle = true, .seed = 9});
    Trainer trainer(options);
    trainer.fit(gan, loader);
    *steps = trainer.global_step();
    CHECK(trainer.callback_metrics().count("g_loss_epoch") == 1);
    return values(gan.nets);
  };
  int64_t steps = 0;
  CHECK(run(true, &steps) == expected);
  // 5 batches per epoch: steps after batches 2, 4 and 5 (the last), of both optimizers, in 2 epochs.
  CHECK(steps == 2 * 3 * 2);
  // Without the toggle, G's backward adds into D's accumulating gradients: another result.
  CHECK(run(false, &steps) != expected);
}

TEST_CASE("Manual optimization: schedules and clipping are the module's call") {
  struct Single : TrainModule {
    explicit Single(bool step_schedule) : step_schedule(step_schedule) { automatic_optimization = false; }
    nn::Module& model() override { return net; }
    OptimizerConfigs configure_optimizers() override {
      OptimizerConfig config;
      config.optimizer = sgd(net.parameters(), 1.0);
      config.scheduler = std::make_unique<optim::StepLR>(*config.optimizer, 1, 0.5);
      return config;
    }
    Tensor training_step(const Batch&, int64_t) override {
      OptimizerHandle opt = optimizers().at(0);
      REQUIRE(lr_schedulers().size() == 1);
      manual_backward(sum(net.a * 100.0));  // gradient 100 per element
      clip_gradients(opt, 0.25, "value");
      opt.step();
      opt.zero_grad();
      if (step_schedule) lr_schedulers()[0]->step();
      return Tensor();
    }
    bool step_schedule;
    FourParams net;
  };
  auto data = std::make_shared<TensorDataset>(zeros({3, 1}), zeros({3, 1}));
  TrainerOptions options = quiet_options();
  options.max_epochs = 1;
  for (bool step_schedule : {false, true}) {
    CAPTURE(step_schedule);
    Single module(step_schedule);
    DataLoader loader(data, DataLoaderOptions{.batch_size = 1});
    Trainer trainer(options);
    trainer.fit(module, loader);
    CHECK(trainer.global_step() == 3);
    // Clipped to 0.25; lr 1 every step unless the module halves it after each step (1, 0.5, 0.25).
    const double moved = step_schedule ? 0.25 * (1 + 0.5 + 0.25) : 0.25 * 3;
    KILN_CHECK_CLOSE(module.net.a, full({2}, 1.0 - moved), 1e-6, 1e-6);
    CHECK(trainer.lr_scheduler()->get_last_lr()[0] == doctest::Approx(step_schedule ? 0.125 : 1.0));
  }
}

TEST_CASE("Manual optimization: misuse gives Lightning's errors") {
  DataLoader loader(one_example(), DataLoaderOptions{.batch_size = 1});
  SUBCASE("several optimizers need manual optimization") {
    Toggling module;
    module.automatic_optimization = true;
    CHECK_THROWS_WITH_AS(Trainer(quiet_options()).fit(module, loader),
                         doctest::Contains("only supported with manual optimization"), Error);
  }
  SUBCASE("accumulate_grad_batches and gradient_clip_val are refused with manual optimization") {
    Toggling module;
    TrainerOptions accumulate = quiet_options();
    accumulate.accumulate_grad_batches = 2;
    CHECK_THROWS_WITH_AS(Trainer(accumulate).fit(module, loader),
                         doctest::Contains("accumulation is not supported for manual optimization"), Error);
    TrainerOptions clip = quiet_options();
    clip.gradient_clip_val = 1;
    CHECK_THROWS_WITH_AS(Trainer(clip).fit(module, loader),
                         doctest::Contains("clipping is not supported for manual optimization"), Error);
  }
  SUBCASE("manual_backward in automatic mode, a wrong optimizer count") {
    struct Misuse : Toggling {
      Tensor training_step(const Batch& batch, int64_t index) override {
        CHECK_THROWS_WITH_AS(optimizers<3>(), doctest::Contains("returned 2"), Error);
        automatic_optimization = true;
        CHECK_THROWS_WITH_AS(manual_backward(sum(params.b)), doctest::Contains("disable automatic optimization"),
                             Error);
        automatic_optimization = false;
        return Toggling::training_step(batch, index);
      }
    } module;
    TrainerOptions options = quiet_options();
    options.max_epochs = 1;
    Trainer(options).fit(module, loader);
    CHECK(module.steps_seen == 1);
  }
  SUBCASE("optimizers() outside fit") {
    Toggling module;
    CHECK_THROWS_WITH_AS(module.optimizers(), doctest::Contains("while Trainer::fit runs"), Error);
  }
}
