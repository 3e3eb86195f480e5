#include "trainer/lr_finder.h"

#include <cmath>
#include <limits>

#include "trainer/finder_support.h"
#include "trainer/plot_raster.h"
#include "trainer/plot_svg.h"
#include "trainer/tensorboard_logger.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {

void check_options(const LRFinderOptions& options) {
  KILN_CHECK(options.mode == "exponential" || options.mode == "linear",
             "LearningRateFinder: mode must be \"exponential\" or \"linear\", got '", options.mode, "'");
  KILN_CHECK(options.min_lr > 0 && options.max_lr > options.min_lr,
             "LearningRateFinder: need 0 < min_lr < max_lr, got ", options.min_lr, " and ", options.max_lr);
  KILN_CHECK(options.num_training >= 1, "LearningRateFinder: num_training must be >= 1, got ", options.num_training);
  KILN_CHECK(!options.early_stop_threshold || *options.early_stop_threshold > 0,
             "LearningRateFinder: early_stop_threshold must be positive, got ",
             options.early_stop_threshold.value_or(0));
  KILN_CHECK(options.beta >= 0 && options.beta < 1, "LearningRateFinder: beta must be in [0, 1), got ", options.beta);
}

// One sweep on `optimizer`; everything the steps change is restored before
// returning or rethrowing, as Lightning restores its checkpoint in `finally`.
LRFinder sweep(TrainModule& module, optim::Optimizer& optimizer, DataLoader& loader, int64_t batches_per_epoch,
               const detail::StepSettings& settings, const LRFinderOptions& options) {
  detail::TrainingSnapshot snapshot(module.model(), optimizer, &loader);
  LRFinder result(options);
  try {
    detail::FinderLoop loop(module, optimizer, loader, batches_per_epoch, settings);
    double average = 0, best = 0;
    for (int64_t step = 0; step < options.num_training; ++step) {
      const double lr = lr_finder_lr(options, step);
      for (int64_t group = 0; group < optimizer.num_groups(); ++group) optimizer.set_lr(group, lr);
      const double loss = loop.step().item<double>();
      const int64_t current_step = step + 1;
      // Bias correction divides by 1 - beta^(losses averaged), as fastai and
      // Lightning 1.x. Lightning 2.x divides by 1 - beta^(current_step + 1)
      // since global_step now advances before on_train_batch_end, which halves
      // the first smoothed loss and draws a spurious rise at the curve's start.
      average = options.beta * average + (1 - options.beta) * loss;
      const double smoothed = average / (1 - std::pow(options.beta, static_cast<double>(current_step)));
      result.lrs.push_back(lr);
      result.losses.push_back(smoothed);
      const bool diverged =
          options.early_stop_threshold && current_step > 1 && smoothed > *options.early_stop_threshold * best;
      if (smoothed < best || current_step == 1) best = smoothed;
      if (diverged) {
        result.stopped_early = true;
        break;
      }
    }
  } catch (...) {
    snapshot.restore();
    throw;
  }
  snapshot.restore();
  return result;
}

// Loss against lr, the suggestion marked when `suggest` (what plot() draws).
LinePlot loss_curve(const LRFinder& result, bool suggest) {
  LinePlot figure;
  figure.x = result.lrs;
  figure.y = result.losses;
  figure.log_x = result.options().mode == "exponential";
  figure.title = "Learning rate finder";
  figure.x_label = "Learning rate";
  figure.y_label = "Loss";
  if (suggest) figure.marker = result.suggestion_index();
  return figure;
}

// With a TensorBoardLogger, the plot also goes to TensorBoard as the image
// "lr_finder" (Lightning users call lr_finder.plot() and add the figure).
void log_plot_to_tensorboard(const Trainer& trainer, const LRFinder& result) {
  TensorBoardLogger* logger = find_tensorboard_logger(trainer);
  if (logger == nullptr || result.lrs.empty()) return;
  const RgbImage image = rasterize_line_plot(loss_curve(result, /*suggest=*/true));
  logger->log_image("lr_finder", image.width, image.height, 3, image.pixels.data(), trainer.global_step());
}

void apply_suggestion(const LRFinder& result, optim::Optimizer* optimizer, const LRFinderOptions& options) {
  if (!options.update_attr) return;
  const std::optional<double> lr = result.suggestion();
  if (!lr) return;
  if (optimizer) {
    for (int64_t group = 0; group < optimizer->num_groups(); ++group) optimizer->set_lr(group, *lr);
  }
  if (options.lr_attr) options.lr_attr(*lr);
}

}  // namespace

double lr_finder_lr(const LRFinderOptions& options, int64_t step) {
  if (step <= 0) return options.min_lr;
  const double r = static_cast<double>(step + 1) / static_cast<double>(options.num_training);
  if (options.mode == "linear") return options.min_lr + r * (options.max_lr - options.min_lr);
  return options.min_lr * std::pow(options.max_lr / options.min_lr, r);
}

std::optional<size_t> LRFinder::suggestion_index(int64_t skip_begin, int64_t skip_end) const {
  const int64_t count = static_cast<int64_t>(std::min(lrs.size(), losses.size()));
  const int64_t end = count - std::max<int64_t>(skip_end, 0);
  std::vector<size_t> kept;  // finite points in [skip_begin, end)
  for (int64_t i = std::max<int64_t>(skip_begin, 0); i < end; ++i) {
    if (std::isfinite(losses[i])) kept.push_back(static_cast<size_t>(i));
  }
  if (kept.size() < 2) return std::nullopt;
  // torch.gradient(losses, spacing=[x]): second-order central differences for
  // uneven spacing inside, one-sided first-order differences at the ends. x is
  // the coordinate the lrs were sampled evenly in: log10(lr) in exponential
  // mode, lr in linear mode. (Lightning 2.5.3 took x = lr in both modes, which
  // makes the tiny steps at the start of an exponential sweep win on noise
  // alone, issue #21141; its proposed fix, PR #21171, is this.)
  const bool log_x = options_.mode == "exponential";
  const size_t m = kept.size();
  auto x = [&](size_t j) { return log_x ? std::log10(lrs[kept[j]]) : lrs[kept[j]]; };
  auto f = [&](size_t j) { return losses[kept[j]]; };
  size_t best = 0;
  double best_gradient = std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < m; ++j) {
    double gradient;
    if (j == 0) {
      gradient = (f(1) - f(0)) / (x(1) - x(0));
    } else if (j == m - 1) {
      gradient = (f(j) - f(j - 1)) / (x(j) - x(j - 1));
    } else {
      const double left = x(j) - x(j - 1), right = x(j + 1) - x(j);
      gradient = (left * left * f(j + 1) - right * right * f(j - 1) + (right * right - left * left) * f(j)) /
                 (left * right * (left + right));
    }
    if (gradient < best_gradient) {  // the first minimum, as torch.argmin
      best_gradient = gradient;
      best = j;
    }
  }
  return kept[best];
}

std::optional<double> LRFinder::suggestion(int64_t skip_begin, int64_t skip_end) const {
  const std::optional<size_t> index = suggestion_index(skip_begin, skip_end);
  if (!index) return std::nullopt;
  return lrs[*index];
}

void LRFinder::plot(const std::string& path, bool suggest) const {
  write_svg_line_plot(path, loss_curve(*this, suggest));
}

LRFinder lr_find(Trainer& trainer, TrainModule& module, DataLoader& train_loader, const LRFinderOptions& options) {
  check_options(options);
  if (trainer.options().fast_dev_run > 0) return LRFinder(options);
  detail::check_supported(trainer, module, "lr_find");
  module.model().to(trainer.device(), trainer.param_dtype());  // as fit's setup: bf16-true trials in bfloat16
  OptimizerConfig config = module.configure_optimizers();
  KILN_CHECK(config.optimizer != nullptr, "lr_find: configure_optimizers returned no optimizer");
  LRFinder result = sweep(module, *config.optimizer, train_loader, detail::limited_train_batches(trainer, train_loader),
                          detail::step_settings(trainer), options);
  log_plot_to_tensorboard(trainer, result);
  apply_suggestion(result, nullptr, options);
  return result;
}

LearningRateFinder::LearningRateFinder(LRFinderOptions options) : options_(std::move(options)) {
  check_options(options_);
}

void LearningRateFinder::on_fit_start(Trainer& trainer, TrainModule& module) {
  if (trainer.options().fast_dev_run > 0) return;  // Lightning skips the finder under fast_dev_run
  detail::check_supported(trainer, module, "LearningRateFinder");
  DataLoader* loader = trainer.train_loader();
  KILN_CHECK(loader != nullptr, "LearningRateFinder: the trainer has no training loader");
  optim::Optimizer& optimizer = trainer.optimizer();
  result_ = sweep(module, optimizer, *loader, trainer.num_training_batches(), detail::step_settings(trainer), options_);
  log_plot_to_tensorboard(trainer, *result_);
  apply_suggestion(*result_, &optimizer, options_);
}

}  // namespace kiln
