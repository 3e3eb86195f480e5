// The logger interface the Trainer writes metrics through (Lightning's
// Logger): CSVLogger is the default; TensorBoardLogger and user loggers plug
// in through TrainerOptions::loggers.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kiln {

class Logger {
 public:
  virtual ~Logger() = default;
  // The folder this logger writes into (checkpoints go under the first one's).
  virtual const std::string& log_dir() const = 0;
  virtual void log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) = 0;
  virtual void log_hyperparams(const std::map<std::string, std::string>& hparams) = 0;
  // Makes what was logged durable (called after each epoch and at the end).
  virtual void save() = 0;
};

}  // namespace kiln
