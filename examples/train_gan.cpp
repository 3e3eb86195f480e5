// train_gan: a small GAN on Fashion-MNIST with two optimizers in manual
// optimization, after the seed documents' SimpleGAN: gradients accumulate over
// --accumulate batches, and each of the discriminator and generator steps runs
// inside its optimizer's toggle_model(sync_grad = last batch of the
// accumulation), so the other network's parameters get no gradient and a DDP
// run synchronizes only when it steps. At the end it writes an 8x8 grid of
// generated samples as a PNG.
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
#include "nn/layers.h"
#include "nn/loss.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kImageSide = 28;
constexpr int64_t kImagePixels = kImageSide * kImageSide;
constexpr int64_t kGridSide = 8;  // the samples image: 8 x 8 generated images

struct GanRecipe {
  int64_t batch_size = 128;
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

std::shared_ptr<nn::Sequential> mlp(const std::vector<int64_t>& widths, nn::ModulePtr last_activation) {
  auto layers = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    layers->push_back(std::make_shared<nn::Linear>(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) layers->push_back(std::make_shared<LeakyReLU>(0.2));
  }
  if (last_activation) layers->push_back(std::move(last_activation));
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
    // z -> 256 -> 512 -> 784 pixels in [-1, 1], the range of the normalized images.
    generator = networks_.register_module(
        "generator", mlp({recipe.latent_dim, 256, 512, kImagePixels}, std::make_shared<nn::Tanh>()));
    // 784 pixels -> 512 -> 256 -> one logit (BCEWithLogitsLoss applies the sigmoid).
    discriminator = networks_.register_module("discriminator", mlp({kImagePixels, 512, 256, 1}, nullptr));
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
    const Tensor fake_label = zeros({batch_size, 1}, {.device = real.device()});
    // Step, and synchronize gradients, at the end of each accumulation or of the epoch.
    const bool is_last_batch_to_accumulate =
        (batch_idx + 1) % recipe_.accumulate == 0 || trainer()->is_last_batch();

    const Tensor fake = sample_G(batch_size, real.device()).flatten(1);  // (B, 784)

    // Optimize the discriminator: real images score 1, generated ones 0.
    Tensor d_loss;
    {
      auto toggled = d_opt.toggle_model(/*sync_grad=*/is_last_batch_to_accumulate);
      const Tensor d_real = criterion_(discriminator->forward(real), real_label);
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

}  // namespace

int main(int argc, char** argv) {
  const auto launch = std::chrono::steady_clock::now();
  CLI::App app{"Train a small GAN on Fashion-MNIST with kiln (two optimizers, manual optimization)"};
  TrainerOptions trainer_options;
  trainer_options.max_epochs = 1;
  trainer_options.default_root_dir = "./runs";
  trainer_options.log_every_n_steps = 50;
  GanRecipe recipe;

  app.add_option("--max-epochs", trainer_options.max_epochs, "Stop after this many epochs")->capture_default_str();
  app.add_option("--batch-size", recipe.batch_size, "Batch size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--accumulate", recipe.accumulate,
                 "Accumulate gradients over this many batches before each optimizer step (done in training_step: "
                 "manual optimization)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--limit-train-batches", trainer_options.limit_train_batches,
                 "Fraction (<= 1) or number of training batches per epoch")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", recipe.lr, "Adam learning rate of both networks")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--latent-dim", recipe.latent_dim, "Size of the generator's noise input")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--accelerator", trainer_options.accelerator, "cpu, gpu or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu", "cuda", "auto"}));
  app.add_option("--devices", trainer_options.devices, "Devices (processes) per node; more than one needs kiln-run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--strategy", trainer_options.strategy, "auto or ddp")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "ddp"}));
  app.add_option("--num-nodes", trainer_options.num_nodes, "Number of machines")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", recipe.seed, "Random seed")->capture_default_str();
  app.add_option("--default-root-dir", trainer_options.default_root_dir, "Folder for logs")->capture_default_str();
  app.add_option("--log-every-n-steps", trainer_options.log_every_n_steps,
                 "Log step metrics every N optimizer steps (each optimizer's step counts)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--enable-progress-bar", trainer_options.enable_progress_bar, "Show a progress bar (true/false)")
      ->capture_default_str();
  app.add_option("--num-workers", recipe.num_workers, "Data-loading worker threads")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data-dir", recipe.data_dir, "Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)");
  app.add_option("--output", recipe.output, "PNG file for the 8x8 grid of generated samples")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "train_gan: " << error.what() << " (see --help)\n";
    return 2;
  }
  trainer_options.seed = recipe.seed;

  try {
    // Refuse a bad output path before training rather than after it.
    const fs::path output_folder = fs::absolute(recipe.output).parent_path();
    KILN_CHECK(!recipe.output.empty() && fs::is_directory(output_folder), "--output: folder '",
               output_folder.string(), "' does not exist");
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
    trainer.fit(gan, train_loader);
    if (!trainer.stop_reason.empty()) std::cerr << "train_gan: stopped: " << trainer.stop_reason << "\n";

    Tensor samples;
    {
      NoGradGuard no_grad;
      gan.model().eval();
      samples = gan.sample_G(kGridSide * kGridSide, trainer.device());  // (64, 1, 28, 28)
    }
    // Every rank holds the same generator after DDP's synchronized steps; rank 0 writes.
    if (trainer.is_global_zero()) {
      ImageGridOptions grid;
      grid.nrow = kGridSide;
      grid.normalize = true;
      grid.value_range = std::make_pair(-1.0, 1.0);
      save_image(samples, recipe.output, grid);
    }

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
