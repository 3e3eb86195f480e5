// train_gan: a small GAN on Fashion-MNIST with two optimizers in manual
// optimization, after the seed documents' SimpleGAN: gradients accumulate over
// --accumulate batches, and each of the discriminator and generator steps runs
// inside its optimizer's toggle_model(sync_grad = last batch of the
// accumulation), so the other network's parameters get no gradient and a DDP
// run synchronizes only when it steps.
// The recipe is DCGAN's on MLPs (a small convolutional pair would cost ~15x
// the arithmetic per image on the CPU): Adam lr 2e-4, betas (0.5, 0.999);
// BatchNorm and ReLU in the generator, LeakyReLU(0.2) in the discriminator;
// tanh output on data scaled to [-1, 1]; one-sided label smoothing. The
// defaults (5 epochs of batches of 64, stepping every 2) give recognisable
// garments in about two minutes on 2 CPU cores. A checkpoint is written at
// the end of every epoch (--ckpt-path last resumes), and at the end an 8x8
// grid of generated samples as a PNG; with --logger tensorboard the grid also
// goes to TensorBoard as the image "samples" at every epoch's end.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/image_io.h"
#include "examples/logger_flag.h"
#include "examples/trainer_flags.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "trainer/tensorboard_logger.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kImageSide = 28;
constexpr int64_t kImagePixels = kImageSide * kImageSide;
constexpr int64_t kGridSide = 8;  // the samples image: 8 x 8 generated images
constexpr double kRealLabelSmoothed = 0.9;

struct GanRecipe {
  int64_t batch_size = 64;
  int64_t accumulate = 2;
  int64_t latent_dim = 64;
  double lr = 2e-4;
  int num_workers = 2;
  std::string data_dir;
  std::string output = "samples.png";
  uint64_t seed = 42;
};

// max(x, slope * x), torch.nn.LeakyReLU for slope < 1, composed from a
// differentiable primitive (kiln has no LeakyReLU op; GANs want the nonzero
// gradient for negative inputs that ReLU lacks).
class LeakyReLU : public nn::Module {
 public:
  explicit LeakyReLU(double negative_slope = 0.2) : negative_slope(negative_slope) {}
  Tensor forward(const Tensor& input) override { return maximum(input, mul(input, negative_slope)); }
  std::string type_name() const override { return "LeakyReLU"; }
  double negative_slope;
};

// z -> [Linear -> BatchNorm1d -> ReLU] per hidden width -> Linear -> tanh:
// DCGAN's generator choices for an MLP. BatchNorm keeps every layer's
// activations spread out early in training, which is what lets the generator
// leave the noise regime within the first epoch; the Linear before it needs
// no bias (BatchNorm's shift replaces it).
std::shared_ptr<nn::Sequential> make_generator(int64_t latent_dim, const std::vector<int64_t>& hidden) {
  auto layers = std::make_shared<nn::Sequential>();
  int64_t width = latent_dim;
  for (int64_t next : hidden) {
    layers->push_back(std::make_shared<nn::Linear>(width, next, /*bias=*/false));
    layers->push_back(std::make_shared<nn::BatchNorm1d>(next));
    layers->push_back(std::make_shared<nn::ReLU>());
    width = next;
  }
  layers->push_back(std::make_shared<nn::Linear>(width, kImagePixels));
  layers->push_back(std::make_shared<nn::Tanh>());  // pixels in [-1, 1], the range of the normalized images
  return layers;
}

// pixels -> [Linear -> LeakyReLU(0.2)] per hidden width -> one logit
// (BCEWithLogitsLoss applies the sigmoid). No BatchNorm: the discriminator
// sees real and generated batches separately, and batch statistics would let
// it tell them apart by the batch rather than by the image.
std::shared_ptr<nn::Sequential> make_discriminator(const std::vector<int64_t>& hidden) {
  auto layers = std::make_shared<nn::Sequential>();
  int64_t width = kImagePixels;
  for (int64_t next : hidden) {
    layers->push_back(std::make_shared<nn::Linear>(width, next));
    layers->push_back(std::make_shared<LeakyReLU>(0.2));
    width = next;
  }
  layers->push_back(std::make_shared<nn::Linear>(width, 1));
  return layers;
}

// The trained model: state_dict names "generator.*" and "discriminator.*".
struct GanNetworks : nn::Module {
  std::string type_name() const override { return "GAN"; }
};

class SimpleGAN : public TrainModule {
 public:
  explicit SimpleGAN(const GanRecipe& recipe) : recipe_(recipe) {
    automatic_optimization = false;
    generator = networks_.register_module("generator", make_generator(recipe.latent_dim, {256, 512}));
    discriminator = networks_.register_module("discriminator", make_discriminator({512, 256}));
  }

  nn::Module& model() override { return networks_; }

  // The trainer seeds every rank alike; each rank draws its own noise, or
  // the ranks of a DDP run would all train on the same generated images.
  void on_fit_start() override {
    if (trainer()->world_size() > 1) manual_seed(recipe_.seed + static_cast<uint64_t>(trainer()->global_rank()));
  }

  // Images (n, 1, 28, 28) in [-1, 1] from fresh noise on `device`.
  Tensor sample_G(int64_t n, Device device) {
    return generator->forward(randn({n, recipe_.latent_dim}, {.device = device})).view({n, 1, kImageSide, kImageSide});
  }

  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    auto [g_opt, d_opt] = optimizers<2>();
    const Tensor real = batch.input.flatten(1);  // (B, 784)
    const int64_t batch_size = real.size(0);
    const Tensor real_label = ones({batch_size, 1}, {.device = real.device()});
    // One-sided label smoothing (Salimans et al. 2016): the discriminator aims
    // at 0.9 for real images, so it cannot grow overconfident and starve the
    // generator of gradient; the generator still aims at 1.
    const Tensor smoothed_real_label = full({batch_size, 1}, kRealLabelSmoothed, {.device = real.device()});
    const Tensor fake_label = zeros({batch_size, 1}, {.device = real.device()});
    // Step, and synchronize gradients, at the end of each accumulation or of the epoch.
    const bool is_last_batch_to_accumulate =
        (batch_idx + 1) % recipe_.accumulate == 0 || trainer()->is_last_batch();

    const Tensor fake = sample_G(batch_size, real.device()).flatten(1);  // (B, 784)

    // Optimize the discriminator: real images score 1, generated ones 0.
    Tensor d_loss;
    {
      auto toggled = d_opt.toggle_model(/*sync_grad=*/is_last_batch_to_accumulate);
      const Tensor d_real = criterion_(discriminator->forward(real), smoothed_real_label);
      const Tensor d_fake = criterion_(discriminator->forward(fake.detach()), fake_label);
      d_loss = d_real + d_fake;
      manual_backward(d_loss);
      if (is_last_batch_to_accumulate) {
        d_opt.step();
        d_opt.zero_grad();
      }
    }
    // Optimize the generator: make the discriminator score its images 1.
    Tensor g_loss;
    {
      auto toggled = g_opt.toggle_model(/*sync_grad=*/is_last_batch_to_accumulate);
      g_loss = criterion_(discriminator->forward(fake), real_label);
      manual_backward(g_loss);
      if (is_last_batch_to_accumulate) {
        g_opt.step();
        g_opt.zero_grad();
      }
    }
    log("g_loss", g_loss, std::nullopt, std::nullopt, /*prog_bar=*/true, batch_size);
    log("d_loss", d_loss, std::nullopt, std::nullopt, /*prog_bar=*/true, batch_size);
    last_g_loss = g_loss.detach();
    last_d_loss = d_loss.detach();
    return Tensor();
  }

  OptimizerConfigs configure_optimizers() override {
    optim::AdamOptions adam;
    adam.lr = recipe_.lr;
    adam.beta1 = 0.5;  // the DCGAN recipe: a short momentum follows the moving target of the other network
    adam.beta2 = 0.999;
    return {OptimizerConfig{std::make_unique<optim::Adam>(generator->parameters(), adam)},
            OptimizerConfig{std::make_unique<optim::Adam>(discriminator->parameters(), adam)}};
  }

  std::shared_ptr<nn::Sequential> generator, discriminator;
  Tensor last_g_loss, last_d_loss;

 private:
  GanRecipe recipe_;
  GanNetworks networks_;
  nn::BCEWithLogitsLoss criterion_;
};

// The samples grid as train_gan writes it: 8 x 8 images, tanh's [-1, 1] shown as [0, 1].
ImageGridOptions samples_grid() {
  ImageGridOptions grid;
  grid.nrow = kGridSide;
  grid.normalize = true;
  grid.value_range = std::make_pair(-1.0, 1.0);
  return grid;
}

// With a TensorBoardLogger, the generator's 8x8 grid as the image "samples" at
// each training epoch's end. The noise is one fixed batch (the DCGAN
// tutorial's fixed_noise), so the epochs' images compare; the generator runs
// in eval mode, as for the final samples, and goes back to training mode.
class SamplesToTensorBoard : public Callback {
 public:
  // `fixed_noise` (64, latent_dim), on any device.
  explicit SamplesToTensorBoard(Tensor fixed_noise) : fixed_noise_(std::move(fixed_noise)) {}
  std::string name() const override { return "SamplesToTensorBoard"; }
  void on_train_epoch_end(Trainer& trainer, TrainModule& module) override {
    TensorBoardLogger* logger = find_tensorboard_logger(trainer);
    if (logger == nullptr) return;
    auto& gan = static_cast<SimpleGAN&>(module);  // train_gan fits nothing else
    Tensor samples;
    {
      NoGradGuard no_grad;
      gan.generator->eval();
      samples = gan.generator->forward(fixed_noise_.to(trainer.device()))
                    .view({kGridSide * kGridSide, 1, kImageSide, kImageSide});
      gan.generator->train();
    }
    logger->log_image("samples", make_image_grid(samples, samples_grid()), trainer.global_step());  // (1, H, W)
  }

 private:
  Tensor fixed_noise_;
};

}  // namespace

int main(int argc, char** argv) {
  const auto launch = std::chrono::steady_clock::now();
  CLI::App app{"Train a small GAN on Fashion-MNIST with kiln (two optimizers, manual optimization)"};
  examples::TrainerFlags flags;
  flags.trainer.max_epochs = 5;
  flags.trainer.default_root_dir = "./runs";
  flags.trainer.log_every_n_steps = 50;
  GanRecipe recipe;
  flags.seed = recipe.seed;
  std::string logger = "csv";

  const examples::TrainerFlagHandles trainer_flags = examples::add_trainer_flags(app, flags);
  // In train_gan's words: a second device means kiln-run, and with two
  // optimizers in manual optimization every one of their steps counts.
  trainer_flags.devices->description("Devices (processes) per node; more than one needs kiln-run")
      ->check(examples::kPositive);
  trainer_flags.num_nodes->check(examples::kPositive);
  trainer_flags.log_every_n_steps->description(
      "Log step metrics every N optimizer steps (each optimizer's step counts)");
  examples::add_logger_flag(app, logger);
  examples::add_data_flags(app, recipe.batch_size, recipe.num_workers, recipe.data_dir);
  app.add_option("--accumulate", recipe.accumulate,
                 "Accumulate gradients over this many batches before each optimizer step (done in training_step: "
                 "manual optimization)")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--lr", recipe.lr, "Adam learning rate of both networks")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--latent-dim", recipe.latent_dim, "Size of the generator's noise input")
      ->capture_default_str()
      ->check(examples::kPositive);
  app.add_option("--output", recipe.output, "PNG file for the 8x8 grid of generated samples")
      ->capture_default_str()
      ->check(examples::kFileInExistingFolder);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "train_gan: " << error.what() << " (see --help)\n";
    return 2;
  }
  recipe.seed = flags.seed;

  try {
    // Refuse a bad output path before training rather than after it.
    const fs::path output_folder = fs::absolute(recipe.output).parent_path();
    KILN_CHECK(!recipe.output.empty() && fs::is_directory(output_folder), "--output: folder '",
               output_folder.string(), "' does not exist");
    // A checkpoint at the end of every epoch (both optimizers' states, the
    // loop position, the RNG states), and last.safetensors for --ckpt-path last.
    ModelCheckpointOptions checkpointing;
    checkpointing.save_last = true;
    TrainerOptions trainer_options = flags.options();
    examples::apply_logger_flag(logger, trainer_options);
    // Drawn before manual_seed below resets the generators, so that it changes nothing training draws.
    const Tensor fixed_noise = randn({kGridSide * kGridSide, recipe.latent_dim});  // (64, latent_dim)
    trainer_options.callbacks = {std::make_shared<ModelCheckpoint>(checkpointing),
                                 std::make_shared<SamplesToTensorBoard>(fixed_noise)};
    Trainer trainer(trainer_options);  // validates the accelerator, ...
    MnistOptions data_options;
    data_options.root = recipe.data_dir;
    data_options.train = true;
    auto train_set = std::make_shared<FashionMNIST>(data_options);

    DataLoaderOptions loader_options;
    loader_options.batch_size = recipe.batch_size;
    loader_options.shuffle = true;
    loader_options.seed = recipe.seed;
    loader_options.num_workers = recipe.num_workers;
    loader_options.pin_memory = true;
    loader_options.persistent_workers = true;
    loader_options.drop_last = true;
    // [0, 1] -> [-1, 1], the generator's tanh range.
    loader_options.transforms = {std::make_shared<Normalize>(std::vector<float>{0.5f}, std::vector<float>{0.5f})};
    DataLoader train_loader(train_set, loader_options);

    manual_seed(recipe.seed);  // the same initial weights for the same seed
    SimpleGAN gan(recipe);
    std::cerr << "train_gan: generator " << gan.generator->parameter_count() << " and discriminator "
              << gan.discriminator->parameter_count() << " parameters on " << trainer.device().str() << ", "
              << train_set->size() << " training images, "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - launch).count()
              << " s after launch\n";
    trainer.fit(gan, train_loader, /*val_loader=*/nullptr, flags.ckpt_path);
    if (!trainer.stop_reason.empty()) std::cerr << "train_gan: stopped: " << trainer.stop_reason << "\n";

    Tensor samples;
    {
      NoGradGuard no_grad;
      gan.model().eval();
      samples = gan.sample_G(kGridSide * kGridSide, trainer.device());  // (64, 1, 28, 28)
    }
    // Every rank holds the same generator after DDP's synchronized steps; rank 0 writes.
    if (trainer.is_global_zero()) save_image(samples, recipe.output, samples_grid());

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - launch).count();
    std::printf("g_loss %.4f  d_loss %.4f  (%lld optimizer steps, %.1f s)\n",
                gan.last_g_loss.defined() ? gan.last_g_loss.item<double>() : 0.0,
                gan.last_d_loss.defined() ? gan.last_d_loss.item<double>() : 0.0,
                static_cast<long long>(trainer.global_step()), seconds);
    if (trainer.is_global_zero()) std::cerr << "train_gan: samples written to " << recipe.output << "\n";
    if (trainer.logger()) std::cerr << "train_gan: logs in " << trainer.logger()->log_dir() << "\n";
  } catch (const Error& error) {
    std::cerr << "train_gan: " << error.message() << "\n";
    return 1;
  } catch (const std::exception& error) {
    std::cerr << "train_gan: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
