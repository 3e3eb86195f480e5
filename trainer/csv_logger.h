// CSVLogger in Lightning's layout: <root>/lightning_logs/version_N/metrics.csv
// (one row per logging call: epoch, step and the metrics; the header is the
// sorted union of every key seen, rewritten when a new key appears) and hparams.yaml.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "trainer/logger.h"

namespace kiln {

class CSVLogger : public Logger {
 public:
  // Creates the next free version_N folder under <root_dir>/lightning_logs.
  explicit CSVLogger(const std::string& root_dir, const std::string& name = "lightning_logs");
  const std::string& log_dir() const override { return log_dir_; }
  int version() const { return version_; }
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) override;
  void log_hyperparams(const std::map<std::string, std::string>& hparams) override;
  // Writes metrics.csv (atomically: temporary file then rename).
  void save() override;

 private:
  std::string log_dir_;
  int version_ = 0;
  std::vector<std::string> columns_;
  std::vector<std::map<std::string, std::string>> rows_;
};

}  // namespace kiln
