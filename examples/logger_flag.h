// --logger for the example binaries: Lightning's Trainer(logger=...) by name,
// "csv" (CSVLogger, the Trainer's default) or "tensorboard"
// (TensorBoardLogger: `tensorboard --logdir <default root dir>` shows the
// run's scalars, hyperparameters, images and histograms). Header-only, like
// trainer_flags.h.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "trainer/tensorboard_logger.h"
#include "trainer/trainer.h"

namespace kiln::examples {

// Adds --logger bound to `logger` (which must outlive app.parse).
inline CLI::Option* add_logger_flag(CLI::App& app, std::string& logger) {
  return app
      .add_option("--logger", logger,
                  "csv (metrics.csv) or tensorboard (event files for `tensorboard --logdir <default root dir>`)")
      ->capture_default_str()
      ->check(CLI::IsMember({"csv", "tensorboard"}));
}

// Puts the logger named `logger` into `options` (after --default-root-dir is
// read). "csv" leaves the loggers empty: the Trainer makes its CSVLogger. A
// TensorBoardLogger makes its folder at first use, so a run refused before it
// logs, and every rank but 0 (whose Trainer never logs), write nothing.
inline void apply_logger_flag(const std::string& logger, TrainerOptions& options) {
  if (logger == "tensorboard") options.loggers = {std::make_shared<TensorBoardLogger>(options.default_root_dir)};
}

}  // namespace kiln::examples
