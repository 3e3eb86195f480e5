// train_fashion: trains a reference model on Fashion-MNIST with kiln's
// Trainer. With no arguments: FashionCNN, AdamW + OneCycle, normalization and
// light augmentation, on the GPU when there is one, else the CPU; validation
// every epoch, early stopping, checkpoints and CSV logs under ./runs, then a
// test pass that prints the accuracy and logs it as test_acc.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "examples/trainer_flags.h"
#include "kernels/cuda/runtime.h"
#include "nn/checkpoint.h"
#include "nn/models.h"
#include "optim/lr_scheduler.h"
#include "trainer/batch_size_finder.h"
#include "trainer/lr_finder.h"
#include "trainer/swa_callback.h"
#include "trainer/trainer.h"

using namespace kiln;

namespace {

// Start-up latency, reported at the first training step: the time since
// launch and the part of it spent reading and preparing the data set.
const auto launch_time = std::chrono::steady_clock::now();
double data_loading_seconds = 0;

double seconds_since_launch() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_time).count();
}

struct Recipe {
  std::string model = "cnn";
  int64_t batch_size = 128;
  double lr = 3e-3;
  double weight_decay = 5e-4;
  int num_workers = 2;
  bool pin_memory = true;
  std::string data_dir;
  int early_stopping_patience = 3;
  std::string export_weights;
  bool checkpoint_activations = false;
};

class Classifier : public TrainModule {
 public:
  Classifier(std::shared_ptr<nn::Module> network, const Recipe& recipe, int64_t total_steps)
      : network_(std::move(network)), recipe_(recipe), total_steps_(total_steps) {}

  nn::Module& model() override { return *network_; }

  Tensor training_step(const Batch& batch, int64_t) override {
    if (!first_step_reported_) {
      first_step_reported_ = true;
      std::fprintf(stderr, "train_fashion: first training step %.3f s after launch (%.3f s of it loading data)\n",
                   seconds_since_launch(), data_loading_seconds);
    }
    Tensor loss = cross_entropy(training_forward(batch.input), batch.target);
    log("train_loss", loss, std::nullopt, std::nullopt, /*prog_bar=*/true, batch.size());
    return loss;
  }

  void validation_step(const Batch& batch, int64_t) override { evaluate(batch, "val"); }
  void test_step(const Batch& batch, int64_t) override { evaluate(batch, "test"); }

  OptimizerConfigs configure_optimizers() override {
    OptimizerConfig config;
    optim::AdamWOptions adamw;
    adamw.lr = recipe_.lr;
    adamw.weight_decay = recipe_.weight_decay;
    auto optimizer = std::make_unique<optim::AdamW>(network_->parameters(), adamw);
    optim::OneCycleLROptions schedule;
    schedule.max_lr = {recipe_.lr};
    schedule.total_steps = std::max<int64_t>(total_steps_, 1);
    schedule.pct_start = 0.25;
    config.scheduler = std::make_unique<optim::OneCycleLR>(*optimizer, schedule);
    config.optimizer = std::move(optimizer);
    config.interval = "step";
    return config;
  }

 private:
  void evaluate(const Batch& batch, const std::string& prefix) {
    Tensor logits = network_->forward(batch.input);
    Tensor loss = cross_entropy(logits, batch.target);
    Tensor correct = sum(cast(eq(argmax(logits, 1), batch.target), DType::f32));
    log(prefix + "_loss", loss, false, true, prefix == "val", batch.size());
    log(prefix + "_acc", div(correct, static_cast<double>(batch.size())), false, true, true, batch.size());
  }

  // With --checkpoint-activations the convolutional part (FashionCNN's
  // features; the whole net otherwise) keeps only its input and is recomputed
  // in backward.
  Tensor training_forward(const Tensor& input) {
    if (!recipe_.checkpoint_activations) return network_->forward(input);
    if (auto cnn = std::dynamic_pointer_cast<nn::FashionCNN>(network_)) {
      return cnn->classifier->forward(nn::checkpoint(cnn->features, input));
    }
    return nn::checkpoint(network_, input);
  }

  std::shared_ptr<nn::Module> network_;
  bool first_step_reported_ = false;
  Recipe recipe_;
  int64_t total_steps_;
};

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  if (name == "cnn" || name == "fashioncnn") return std::make_shared<nn::FashionCNN>();
  if (name == "resnet9") return std::make_shared<nn::ResNet9>();
  if (name == "mlp") return std::make_shared<nn::MLP>();
  KILN_THROW("--model: unknown model '", name, "' (expected cnn, resnet9 or mlp)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a reference model on Fashion-MNIST with kiln"};
  examples::TrainerFlags flags;
  TrainerOptions& trainer_options = flags.trainer;
  trainer_options.max_epochs = 10;
  trainer_options.default_root_dir = "./runs";
  trainer_options.log_every_n_steps = 50;
  Recipe recipe;
  bool swa = false, find_lr = false, find_batch_size = false;

  app.add_option("--model", recipe.model, "Model: cnn (FashionCNN), resnet9 or mlp")->capture_default_str();
  examples::add_trainer_flags(app, flags);
  app.add_option("--min-epochs", trainer_options.min_epochs, "Train at least this many epochs")->capture_default_str();
  app.add_option("--max-time", trainer_options.max_time, "Stop after this time (DD:HH:MM:SS or seconds)");
  app.add_option("--accumulate-grad-batches", trainer_options.accumulate_grad_batches,
                 "Accumulate gradients over k batches")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--gradient-clip-val", trainer_options.gradient_clip_val, "Clip gradients at this value (0: off)")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_option("--gradient-clip-algorithm", trainer_options.gradient_clip_algorithm, "norm or value")
      ->capture_default_str()
      ->check(CLI::IsMember({"norm", "value"}));
  app.add_option("--precision", trainer_options.precision, "32-true, 64-true, bf16-true, bf16-mixed, 16-mixed")
      ->capture_default_str();
  examples::add_batches_or_fraction_flag(app, "--val-check-interval", trainer_options.val_check_interval,
                                         "Validate every N batches (4) or every fraction of an epoch (0.25)");
  examples::add_integer_or_none_flag(app, "--check-val-every-n-epoch", trainer_options.check_val_every_n_epoch, 1,
                                     "expected a positive number of epochs or None",
                                     "Validate every N epochs; None: every --val-check-interval batches counted "
                                     "across epochs");
  examples::add_batches_or_fraction_flag(app, "--limit-val-batches", trainer_options.limit_val_batches,
                                         "Validation batches: a number (4) or a fraction (0.25)");
  app.add_option("--fast-dev-run", trainer_options.fast_dev_run, "Run N batches of train/val/test as a smoke test")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_flag("--deterministic", trainer_options.deterministic, "Deterministic algorithms only");
  app.add_flag("--benchmark", trainer_options.benchmark, "cuDNN autotuning");
  examples::add_data_flags(app, recipe.batch_size, recipe.num_workers, recipe.data_dir);
  app.add_option("--lr", recipe.lr, "Peak learning rate (OneCycle max_lr)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--pin-memory", recipe.pin_memory, "Assemble batches in pinned memory (true/false)")
      ->capture_default_str()
      ->check(examples::kTrueOrFalse);
  app.add_option("--early-stopping-patience", recipe.early_stopping_patience,
                 "Validation checks without improvement before stopping")
      ->capture_default_str()
      ->check(examples::kNonNegative);
  app.add_flag("--swa", swa, "Stochastic weight averaging");
  app.add_flag("--find-lr", find_lr, "Run the learning-rate finder first");
  app.add_flag("--find-batch-size", find_batch_size, "Run the batch-size finder first");
  app.add_flag("--checkpoint-activations", recipe.checkpoint_activations,
               "Recompute activations in backward (less memory, more compute)");
  app.add_option("--export-weights", recipe.export_weights,
                 "Write the trained model's weights (PyTorch state_dict names) to this safetensors file")
      ->check(examples::kFileInExistingFolder);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "train_fashion: " << error.what() << " (see --help)\n";
    return 2;
  }
  const uint64_t seed = flags.seed;
  const std::string& ckpt_path = flags.ckpt_path;

  try {
    Trainer trainer(flags.options());  // validates precision, accelerator, ...
    // Nothing runs out of memory on the CPU: the search would only stop at max_val (8192).
    KILN_CHECK(!find_batch_size || trainer.device().is_cuda(),
               "--find-batch-size looks for the largest batch that fits in GPU memory; it needs a GPU");
    const auto data_start = std::chrono::steady_clock::now();
    MnistOptions data_options;
    data_options.root = recipe.data_dir;
    data_options.train = true;
    auto train_set = std::make_shared<FashionMNIST>(data_options);
    data_options.train = false;
    auto test_set = std::make_shared<FashionMNIST>(data_options);
    auto normalize = Normalize::fit(*train_set);
    data_loading_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - data_start).count();

    DataLoaderOptions train_loader_options;
    train_loader_options.batch_size = recipe.batch_size;
    train_loader_options.shuffle = true;
    train_loader_options.seed = seed;
    train_loader_options.num_workers = recipe.num_workers;
    train_loader_options.pin_memory = recipe.pin_memory;
    train_loader_options.persistent_workers = true;
    train_loader_options.drop_last = true;
    train_loader_options.transforms = {std::make_shared<RandomCrop>(2), std::make_shared<RandomHorizontalFlip>(),
                                       normalize};
    auto network = make_model(recipe.model);
    // Tuning before fit, as Lightning's Tuner: the batch size first (the best lr
    // depends on it). Each finder trains a throwaway Classifier over `network`
    // and puts the weights back.
    if (find_batch_size) {
      DataLoader probe_loader(train_set, train_loader_options);
      Classifier probe(network, recipe, /*total_steps=*/1);
      const BatchSizeFinderResult found = scale_batch_size(trainer, probe, probe_loader);
      std::cerr << "train_fashion: batch size finder chose " << found.batch_size << " (" << found.trials.size()
                << " sizes tried)\n";
      recipe.batch_size = train_loader_options.batch_size = found.batch_size;
    }
    DataLoaderOptions eval_loader_options = train_loader_options;
    eval_loader_options.batch_size = 1000;
    eval_loader_options.shuffle = false;
    eval_loader_options.drop_last = false;
    eval_loader_options.transforms = {normalize};
    DataLoader train_loader(train_set, train_loader_options);
    DataLoader test_loader(test_set, eval_loader_options);
    if (find_lr) {
      Classifier probe(network, recipe, trainer.estimated_stepping_batches(train_loader));
      LRFinderOptions finder_options;
      finder_options.lr_attr = [&](double lr) { recipe.lr = lr; };  // update_attr: OneCycle's peak lr
      const LRFinder finder = lr_find(trainer, probe, train_loader, finder_options);
      if (!finder.lrs.empty()) {  // empty under --fast-dev-run, as Lightning
        std::filesystem::create_directories(trainer_options.default_root_dir);
        const std::string plot = (std::filesystem::path(trainer_options.default_root_dir) / "lr_find.svg").string();
        finder.plot(plot);
        std::cerr << "train_fashion: lr finder ran " << finder.lrs.size() << " steps, ";
        if (const std::optional<double> lr = finder.suggestion()) {
          std::cerr << "suggested lr " << *lr;
        } else {
          std::cerr << "no suggestion (too few steps), keeping lr " << recipe.lr;
        }
        std::cerr << "; plot in " << plot << "\n";
      }
    }
    Classifier module(network, recipe, trainer.estimated_stepping_batches(train_loader));
    EarlyStoppingOptions stopping;
    stopping.monitor = "val_loss";
    stopping.patience = recipe.early_stopping_patience;
    ModelCheckpointOptions checkpointing;
    checkpointing.monitor = "val_acc";
    checkpointing.mode = "max";
    checkpointing.save_last = true;
    checkpointing.filename = "{epoch}-{step}-{val_acc}";  // "epoch=9-step=4680-val_acc=0.9239"
    auto early_stopping = std::make_shared<EarlyStopping>(stopping);
    auto model_checkpoint = std::make_shared<ModelCheckpoint>(checkpointing);
    // The Trainer keeps its callbacks in its options.
    TrainerOptions with_callbacks = trainer.options();
    with_callbacks.callbacks = {early_stopping, model_checkpoint};
    if (swa) {
      // Averages the weights of the last 20% of the epochs at a tenth of the peak LR.
      StochasticWeightAveragingOptions averaging;
      averaging.swa_lrs = {recipe.lr / 10};
      averaging.annealing_epochs = 1;
      with_callbacks.callbacks.push_back(std::make_shared<StochasticWeightAveraging>(averaging));
    }
    Trainer run(with_callbacks);

    std::cerr << "train_fashion: " << network->type_name() << " with " << network->parameter_count()
              << " parameters on " << run.device().str() << ", " << train_set->size() << " training images, "
              << seconds_since_launch() << " s after launch\n";
    // The test split doubles as the validation set, as in the usual Fashion-MNIST recipes.
    run.fit(module, train_loader, &test_loader, ckpt_path);
    if (!run.stop_reason.empty()) std::cerr << "train_fashion: stopped: " << run.stop_reason << "\n";
    std::map<std::string, double> results = run.test(module, test_loader);
    const double seconds = seconds_since_launch();
    std::printf("test_acc %.4f  test_loss %.4f  (%lld optimizer steps, %.1f s)\n", results["test_acc"],
                results["test_loss"], static_cast<long long>(run.global_step()), seconds);
    if (!recipe.export_weights.empty() && run.is_global_zero()) {
      NamedTensorList weights;
      for (auto& [name, tensor] : network->state_dict()) weights.emplace_back(name, tensor);
      save_safetensors(recipe.export_weights, weights, {{"format", "pt"}});
      std::cerr << "train_fashion: weights written to " << recipe.export_weights << "\n";
    }
    if (run.logger()) std::cerr << "train_fashion: logs in " << run.logger()->log_dir() << "\n";
  } catch (const Error& error) {
    std::cerr << "train_fashion: " << error.message() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "train_fashion: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
