// The command-line flags that train_fashion, train_vit, train_gpt and train_gan share, declared
// once: Lightning's Trainer flags in kebab-case, bound to a TrainerOptions,
// and the Fashion-MNIST loading flags. Header-only, for the examples (the
// library itself has no CLI11 dependency).
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "examples/cli_checks.h"
#include "trainer/trainer.h"

namespace kiln::examples {

// What the shared Trainer flags set. The values in `trainer` (and `seed`)
// when add_trainer_flags runs are the defaults that --help shows, so a binary
// sets its own defaults (e.g. max_epochs) first.
struct TrainerFlags {
  TrainerOptions trainer;
  uint64_t seed = 42;      // --seed: also the binaries' data-loader and weight seed
  std::string ckpt_path;   // --ckpt-path: a checkpoint file, "last", or empty (start afresh)

  // The options to build the Trainer from: `trainer` with --seed applied.
  TrainerOptions options() const {
    TrainerOptions with_seed = trainer;
    with_seed.seed = seed;
    return with_seed;
  }
};

// The flags add_trainer_flags declared whose text or checks a binary refines
// (e.g. train_gan, in manual optimization, says that each optimizer's step counts).
struct TrainerFlagHandles {
  CLI::Option* devices = nullptr;
  CLI::Option* num_nodes = nullptr;
  CLI::Option* log_every_n_steps = nullptr;
};

// Lightning's CLI spelling of None for an optional flag ("None", "none" or "null").
inline bool is_none(const std::string& text) { return text == "None" || text == "none" || text == "null"; }

// `text` as a whole integer (nothing before or after it), or nullopt.
inline std::optional<int64_t> parse_integer(const std::string& text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// A Lightning int-or-None flag bound to `target` (None: nullopt). Text that is
// neither, or an integer below `minimum`, is refused at parse time with
// "<expected>, got '<text>'".
inline CLI::Option* add_integer_or_none_flag(CLI::App& app, const std::string& name, std::optional<int64_t>& target,
                                             int64_t minimum, const std::string& expected,
                                             const std::string& description) {
  auto check = [minimum, expected](std::string& text) -> std::string {
    const std::optional<int64_t> value = parse_integer(text);
    if (is_none(text) || (value && *value >= minimum)) return {};
    return expected + ", got '" + text + "'";
  };
  return app
      .add_option_function<std::string>(
          name, [&target](const std::string& text) { target = is_none(text) ? std::nullopt : parse_integer(text); },
          description)
      ->type_name("INT|None")
      ->default_str(target ? std::to_string(*target) : "None")
      ->check(CLI::Validator(check, ""));
}

// A Lightning int-or-float flag bound to `target` (trainer/batches_or_fraction.h):
// "4" is four batches, "0.25" a quarter of an epoch, "1.0" the whole epoch.
// A value that is neither, or out of range, is refused at parse time.
inline CLI::Option* add_batches_or_fraction_flag(CLI::App& app, const std::string& name, BatchesOrFraction& target,
                                                 const std::string& description) {
  auto check = [](std::string& text) -> std::string {
    const std::optional<BatchesOrFraction> parsed = BatchesOrFraction::try_parse(text);
    if (!parsed) return std::string(BatchesOrFraction::kExpected) + ", got '" + text + "'";
    return parsed->problem();
  };
  return app
      .add_option_function<std::string>(
          name, [&target, name](const std::string& text) { target = BatchesOrFraction::parse(text, name); },
          description)
      ->type_name("INT|FLOAT")
      ->default_str(target.to_string())
      ->check(CLI::Validator(check, ""));
}

// Adds --max-epochs, --max-steps, --limit-train-batches, --accelerator,
// --devices, --strategy, --num-nodes, --seed, --default-root-dir,
// --ckpt-path, --log-every-n-steps, --enable-progress-bar and --profiler, in that order,
// bound to `flags` (which must outlive app.parse).
inline TrainerFlagHandles add_trainer_flags(CLI::App& app, TrainerFlags& flags) {
  TrainerOptions& options = flags.trainer;
  TrainerFlagHandles handles;
  // Any integer passes here: the Trainer says what is wrong with values below -1.
  add_integer_or_none_flag(app, "--max-epochs", options.max_epochs, std::numeric_limits<int64_t>::min(),
                           "expected a number of epochs (-1: no limit) or None",
                           "Stop after this many epochs (-1: no limit; None: 1000 unless --max-steps or --max-time "
                           "is set)");
  app.add_option("--max-steps", options.max_steps, "Stop after this many optimizer steps (-1: no limit)")
      ->capture_default_str();
  add_batches_or_fraction_flag(app, "--limit-train-batches", options.limit_train_batches,
                               "Training batches per epoch: a number (4) or a fraction (0.25)");
  app.add_option("--accelerator", options.accelerator, "cpu, gpu or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu", "cuda", "auto"}));
  handles.devices = app.add_option("--devices", options.devices, "Number of devices")->capture_default_str();
  app.add_option("--strategy", options.strategy, "auto or ddp")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "ddp"}));
  handles.num_nodes = app.add_option("--num-nodes", options.num_nodes, "Number of machines")->capture_default_str();
  app.add_option("--seed", flags.seed, "Random seed")->capture_default_str()->check(kNonNegative);
  app.add_option("--default-root-dir", options.default_root_dir, "Folder for logs and checkpoints")
      ->capture_default_str();
  app.add_option("--ckpt-path", flags.ckpt_path, "Resume from this checkpoint, or \"last\"");
  handles.log_every_n_steps =
      app.add_option("--log-every-n-steps", options.log_every_n_steps, "Log step metrics every N steps")
          ->capture_default_str()
          ->check(kPositive);
  app.add_option("--enable-progress-bar", options.enable_progress_bar, "Show a progress bar (true/false)")
      ->capture_default_str()
      ->check(kTrueOrFalse);
  app.add_option("--profiler", options.profiler,
                 "simple (time per Trainer action) or pytorch (time per op); the report prints when a stage ends")
      ->check(CLI::IsMember({"", "simple", "pytorch"}));
  return handles;
}

// The Trainer flags of automatic optimization that train_fashion, train_vit
// and train_gpt share beyond add_trainer_flags: epochs and time, gradient
// accumulation and clipping, precision, validation cadence, smoke runs and
// cuDNN settings.
inline void add_fit_flags(CLI::App& app, TrainerFlags& flags) {
  app.add_option("--min-epochs", flags.trainer.min_epochs, "Train at least this many epochs")->capture_default_str();
  app.add_option("--max-time", flags.trainer.max_time, "Stop after this time (DD:HH:MM:SS or seconds)");
  app.add_option("--accumulate-grad-batches", flags.trainer.accumulate_grad_batches,
                 "Accumulate gradients over k batches")
      ->capture_default_str()
      ->check(kPositive);
  app.add_option("--gradient-clip-val", flags.trainer.gradient_clip_val, "Clip gradients at this value (0: off)")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--gradient-clip-algorithm", flags.trainer.gradient_clip_algorithm, "norm or value")
      ->capture_default_str()
      ->check(CLI::IsMember({"norm", "value"}));
  app.add_option("--precision", flags.trainer.precision,
                 "32-true, 64-true, bf16-true (bf16 weights and optimizer state), bf16-true-fp32-master, bf16-mixed, "
                 "16-mixed")
      ->capture_default_str();
  add_batches_or_fraction_flag(app, "--val-check-interval", flags.trainer.val_check_interval,
                               "Validate every N batches (4) or every fraction of an epoch (0.25)");
  add_integer_or_none_flag(app, "--check-val-every-n-epoch", flags.trainer.check_val_every_n_epoch, 1,
                           "expected a positive number of epochs or None",
                           "Validate every N epochs; None: every --val-check-interval batches counted across epochs");
  add_batches_or_fraction_flag(app, "--limit-val-batches", flags.trainer.limit_val_batches,
                               "Validation batches: a number (4) or a fraction (0.25)");
  app.add_option("--fast-dev-run", flags.trainer.fast_dev_run, "Run N batches of train/val/test as a smoke test")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_flag("--deterministic", flags.trainer.deterministic, "Deterministic algorithms only");
  app.add_flag("--benchmark", flags.trainer.benchmark, "cuDNN autotuning");
  // auto (unset): on for a GPU fit; true on the CPU is refused by the Trainer.
  std::optional<bool>& cuda_graph = flags.trainer.cuda_graph;
  app.add_option_function<std::string>(
         "--cuda-graph",
         [&cuda_graph](const std::string& text) {
           bool value = false;
           if (text == "auto") {
             cuda_graph.reset();
           } else if (CLI::detail::lexical_cast(text, value)) {
             cuda_graph = value;
           }
         },
         "true: each optimizer step is one CUDA graph replay after 3 eager steps (GPU only); false: eager "
         "steps; auto: true on a GPU, false on the CPU")
      ->type_name("true|false|auto")
      ->default_str(cuda_graph ? (*cuda_graph ? "true" : "false") : "auto")
      ->check(kTrueOrFalse | CLI::IsMember({"auto"}));
}

// Adds --batch-size, --num-workers and --data-dir (empty: FashionMNIST's
// default folder), bound to the given values (which must outlive app.parse).
inline void add_data_flags(CLI::App& app, int64_t& batch_size, int& num_workers, std::string& data_dir) {
  app.add_option("--batch-size", batch_size, "Batch size")->capture_default_str()->check(kPositive);
  app.add_option("--num-workers", num_workers, "Data-loading worker threads")
      ->capture_default_str()
      ->check(kNonNegative);
  app.add_option("--data-dir", data_dir, "Fashion-MNIST folder (default /usr/share/datasets/fashion-mnist)");
}

}  // namespace kiln::examples
