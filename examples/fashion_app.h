// What train_fashion and train_vit share: one Fashion-MNIST classifier
// program with every Trainer flag, run by fashion_main with each binary's
// defaults (model, learning rate, epochs, batch size, weight decay, label
// smoothing). Validation every epoch, early stopping, checkpoints and CSV logs
// under ./runs, then a test pass that prints the accuracy as test_acc.
#pragma once

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/serialization.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "examples/logger_flag.h"
#include "examples/trainer_flags.h"
#include "kernels/cuda/runtime.h"
#include "nn/checkpoint.h"
#include "nn/models.h"
#include "optim/lr_scheduler.h"
#include "trainer/batch_size_finder.h"
#include "trainer/lr_finder.h"
#include "trainer/swa_callback.h"
#include "trainer/tensorboard_histograms.h"
#include "trainer/trainer.h"
#include "trainer/weight_averaging.h"

namespace kiln::examples {


// Start-up latency, reported at the first training step: the time since
// launch and the part of it spent reading and preparing the data set.
inline const auto launch_time = std::chrono::steady_clock::now();
inline double data_loading_seconds = 0;

inline double seconds_since_launch() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_time).count();
}

struct Recipe {
  std::string program = "train_fashion";
  std::string model = "cnn";
  int64_t batch_size = 128;
  double lr = 3e-3;
  double weight_decay = 5e-4;
  int num_workers = 2;
  bool pin_memory = true;
  std::string data_dir;
  double label_smoothing = 0.0;
  double pct_start = 0.25;             // OneCycle's share of warm-up steps
  std::string augment = "crop+flip";   // "crop+flip", "flip" or "none"
  bool tta = false;                    // evaluate on the image and its mirror, averaged
  int early_stopping_patience = 3;
  std::string export_weights;
  bool checkpoint_activations = false;
  bool channels_last = false;          // Module::to(MemoryFormat::channels_last): NHWC convolutions on a GPU
};

class Classifier : public TrainModule {
 public:
  Classifier(std::shared_ptr<nn::Module> network, const Recipe& recipe, int64_t total_steps)
      : network_(std::move(network)), recipe_(recipe), total_steps_(total_steps) {}

  nn::Module& model() override { return *network_; }

  Tensor training_step(const Batch& batch, int64_t) override {
    if (!first_step_reported_) {
      first_step_reported_ = true;
      std::fprintf(stderr, "%s: first training step %.3f s after launch (%.3f s of it loading data)\n",
                   recipe_.program.c_str(), seconds_since_launch(), data_loading_seconds);
    }
    Tensor loss = cross_entropy(training_forward(batch.input), batch.target, Tensor(), -100, recipe_.label_smoothing);
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
    schedule.pct_start = recipe_.pct_start;
    config.scheduler = std::make_unique<optim::OneCycleLR>(*optimizer, schedule);
    config.optimizer = std::move(optimizer);
    config.interval = "step";
    return config;
  }

 private:
  void evaluate(const Batch& batch, const std::string& prefix) {
    Tensor logits = network_->forward(batch.input);
    if (recipe_.tta) {
      // Test-time augmentation: the mirrored image's logits, averaged in
      // (the training flips images, so the model knows both).
      const int64_t width = batch.input.size(-1);
      const Tensor reversed = arange(static_cast<double>(width - 1), -1.0, -1.0,
                                     {.dtype = DType::i64, .device = batch.input.device()});
      logits = mul(add(logits, network_->forward(index_select(batch.input, -1, reversed))), 0.5);
    }
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

inline std::shared_ptr<nn::Module> make_model(const std::string& name) {
  if (name == "cnn" || name == "fashioncnn") return std::make_shared<nn::FashionCNN>();
  if (name == "resnet9") return std::make_shared<nn::ResNet9>();
  if (name == "mlp") return std::make_shared<nn::MLP>();
  if (name == "vit") return std::make_shared<nn::ViT>();
  KILN_THROW("--model: unknown model '", name, "' (expected cnn, resnet9, mlp or vit)");
}

// A binary's defaults; every one can be changed with its flag.
struct FashionDefaults {
  std::string program = "train_fashion";
  std::string description = "Train a reference model on Fashion-MNIST with kiln";
  std::string model = "cnn";
  int64_t max_epochs = 10;
  int64_t batch_size = 128;
  double lr = 3e-3;
  double weight_decay = 5e-4;
  double label_smoothing = 0.0;
  std::string augment = "crop+flip";
  bool tta = false;
};

// With the progress bar off, one line per validation on stderr, with the time
// since launch ("train_fashion: epoch 3 val_acc 0.9237 val_loss 0.2965, 45.1 s
// after launch"): what bench/time_to_accuracy.py times.
class EpochReport : public Callback {
 public:
  explicit EpochReport(std::string program) : program_(std::move(program)) {}
  std::string name() const override { return "EpochReport"; }
  void on_validation_end(Trainer& trainer, TrainModule&) override {
    if (!trainer.is_global_zero()) return;
    const auto& metrics = trainer.callback_metrics();
    const auto acc = metrics.find("val_acc");
    const auto loss = metrics.find("val_loss");
    if (acc == metrics.end() || loss == metrics.end()) return;
    std::fprintf(stderr, "%s: epoch %lld val_acc %.4f val_loss %.4f, %.1f s after launch\n", program_.c_str(),
                 static_cast<long long>(trainer.current_epoch()), acc->second, loss->second,
                 seconds_since_launch());
  }

 private:
  std::string program_;
};

inline int fashion_main(int argc, char** argv, const FashionDefaults& defaults) {
  const std::string program = defaults.program;
  CLI::App app{defaults.description};
  TrainerFlags flags;
  TrainerOptions& trainer_options = flags.trainer;
  trainer_options.max_epochs = defaults.max_epochs;
  trainer_options.default_root_dir = "./runs";
  trainer_options.log_every_n_steps = 50;
  Recipe recipe;
  recipe.program = program;
  recipe.model = defaults.model;
  recipe.batch_size = defaults.batch_size;
  recipe.lr = defaults.lr;
  recipe.weight_decay = defaults.weight_decay;
  recipe.label_smoothing = defaults.label_smoothing;
  recipe.augment = defaults.augment;
  recipe.tta = defaults.tta;
  bool swa = false, find_lr = false, find_batch_size = false;
  double ema_decay = 0;
  std::string logger = "csv";
  int64_t log_histograms = 0;

  app.add_option("--model", recipe.model, "Model: cnn (FashionCNN), resnet9, mlp or vit")->capture_default_str();
  add_trainer_flags(app, flags);
  add_fit_flags(app, flags);
  add_logger_flag(app, logger);
  app.add_option("--log-histograms", log_histograms,
                 "Histograms of the weights and gradients in TensorBoard every N optimizer steps (0: off; needs "
                 "--logger tensorboard)")
      ->capture_default_str()
      ->check(kNonNegative);
  add_data_flags(app, recipe.batch_size, recipe.num_workers, recipe.data_dir);
  app.add_option("--lr", recipe.lr, "Peak learning rate (OneCycle max_lr)")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--weight-decay", recipe.weight_decay, "AdamW's weight decay")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--label-smoothing", recipe.label_smoothing, "Label smoothing of the training loss")
      ->capture_default_str()
      ->check(in_range(0.0, 1.0));
  app.add_option("--pct-start", recipe.pct_start, "OneCycle's share of steps spent warming up")
      ->capture_default_str()
      ->check(in_range(0.0, 1.0));
  app.add_option("--augment", recipe.augment, "Training augmentation: crop+flip, flip or none")
      ->capture_default_str()
      ->check(CLI::IsMember({"crop+flip", "flip", "none"}));
  app.add_flag("--tta,!--no-tta", recipe.tta,
               "Evaluate on each image and its mirror image, averaged (test-time augmentation)")
      ->capture_default_str();
  app.add_option("--pin-memory", recipe.pin_memory, "Assemble batches in pinned memory (true/false)")
      ->capture_default_str()
      ->check(kTrueOrFalse);
  app.add_option("--early-stopping-patience", recipe.early_stopping_patience,
                 "Validation checks without improvement before stopping")
      ->capture_default_str()
      ->check(kNonNegative);
  CLI::Option* swa_flag = app.add_flag("--swa", swa, "Stochastic weight averaging");
  CLI::Option* ema_option = app.add_option("--ema", ema_decay,
                 "Exponential moving average of the weights with this decay (e.g. 0.999), updated after every "
                 "optimizer step; validation, test and --export-weights use the averaged weights")
      ->check(in_range(0.0, 1.0))
      ->excludes(swa_flag);
  app.add_flag("--find-lr", find_lr, "Run the learning-rate finder first");
  app.add_flag("--find-batch-size", find_batch_size, "Run the batch-size finder first");
  app.add_flag("--checkpoint-activations", recipe.checkpoint_activations,
               "Recompute activations in backward (less memory, more compute)");
  app.add_flag("--channels-last", recipe.channels_last,
               "Convolutions in channels-last (NHWC) memory, as torch's model.to(memory_format=torch.channels_last): "
               "cuDNN's NHWC kernels on a GPU; no effect on the CPU");
  app.add_option("--export-weights", recipe.export_weights,
                 "Write the trained model's weights (PyTorch state_dict names) to this safetensors file")
      ->check(kFileInExistingFolder);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << program << ": " << error.what() << " (see --help)\n";
    return 2;
  }
  const uint64_t seed = flags.seed;
  const std::string& ckpt_path = flags.ckpt_path;

  try {
    KILN_CHECK(log_histograms == 0 || logger == "tensorboard",
               "--log-histograms writes TensorBoard histograms: it needs --logger tensorboard");
    TrainerOptions options = flags.options();
    apply_logger_flag(logger, options);
    Trainer trainer(options);  // validates precision, accelerator, ...
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
    train_loader_options.transforms = {normalize};
    if (recipe.augment != "none") {
      train_loader_options.transforms.insert(train_loader_options.transforms.begin(),
                                             std::make_shared<RandomHorizontalFlip>());
    }
    if (recipe.augment == "crop+flip") {
      train_loader_options.transforms.insert(train_loader_options.transforms.begin(), std::make_shared<RandomCrop>(2));
    }
    auto network = make_model(recipe.model);
    if (recipe.channels_last) network->to(MemoryFormat::channels_last);
    // Tuning before fit, as Lightning's Tuner: the batch size first (the best lr
    // depends on it). Each finder trains a throwaway Classifier over `network`
    // and puts the weights back.
    if (find_batch_size) {
      DataLoader probe_loader(train_set, train_loader_options);
      Classifier probe(network, recipe, /*total_steps=*/1);
      const BatchSizeFinderResult found = scale_batch_size(trainer, probe, probe_loader);
      std::cerr << program << ": batch size finder chose " << found.batch_size << " (" << found.trials.size()
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
        std::cerr << program << ": lr finder ran " << finder.lrs.size() << " steps, ";
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
    if (!trainer_options.enable_progress_bar) {
      with_callbacks.callbacks.push_back(std::make_shared<EpochReport>(program));
    }
    if (swa) {
      // Averages the weights of the last 20% of the epochs at a tenth of the peak LR.
      StochasticWeightAveragingOptions averaging;
      averaging.swa_lrs = {recipe.lr / 10};
      averaging.annealing_epochs = 1;
      with_callbacks.callbacks.push_back(std::make_shared<StochasticWeightAveraging>(averaging));
    }
    if (log_histograms > 0) {
      with_callbacks.callbacks.push_back(std::make_shared<TensorBoardHistograms>(log_histograms));
    }
    if (ema_option->count() > 0) {
      EMAWeightAveragingOptions ema;
      ema.decay = ema_decay;
      with_callbacks.callbacks.push_back(std::make_shared<EMAWeightAveraging>(ema));
    }
    Trainer run(with_callbacks);

    std::cerr << program << ": " << network->type_name() << " with " << network->parameter_count()
              << " parameters on " << run.device().str() << ", " << train_set->size() << " training images, "
              << seconds_since_launch() << " s after launch\n";
    // The test split doubles as the validation set, as in the usual Fashion-MNIST recipes.
    run.fit(module, train_loader, &test_loader, ckpt_path);
    if (!run.stop_reason.empty()) std::cerr << program << ": stopped: " << run.stop_reason << "\n";
    std::map<std::string, double> results = run.test(module, test_loader);
    const double seconds = seconds_since_launch();
    std::printf("test_acc %.4f  test_loss %.4f  (%lld optimizer steps, %.1f s)\n", results["test_acc"],
                results["test_loss"], static_cast<long long>(run.global_step()), seconds);
    if (!recipe.export_weights.empty() && run.is_global_zero()) {
      NamedTensorList weights;
      for (auto& [name, tensor] : network->state_dict()) weights.emplace_back(name, tensor);
      save_safetensors(recipe.export_weights, weights, {{"format", "pt"}});
      std::cerr << program << ": weights written to " << recipe.export_weights << "\n";
    }
    if (run.logger()) std::cerr << program << ": logs in " << run.logger()->log_dir() << "\n";
    if (const std::string curves = run.training_curves_path(); !curves.empty() && std::filesystem::exists(curves)) {
      std::cerr << program << ": training curves in " << curves << "\n";
    }
  } catch (const Error& error) {
    std::cerr << program << ": " << error.message() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << program << ": " << error.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace kiln::examples
