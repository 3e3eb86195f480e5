// The picture of a run: <log dir>/training_curves.svg, three panels over
// optimizer steps: the losses (every logged metric whose name holds "loss":
// train step and epoch values, validation, test), the accuracies (names
// holding "acc") and the learning rate of each optimizer's parameter groups
// (LearningRateMonitor's names, "lr-AdamW", "lr-SGD/pg2"). The Trainer feeds it
// every row its loggers get (rank 0, while logging is on) and writes it when fit
// ends and with every checkpoint, so a run still going, or one that crashed,
// has its picture next to its metrics.csv.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trainer/plot_svg.h"

namespace kiln {

class TrainingCurves {
 public:
  // Keeps the values of `metrics` (logged at optimizer step `step`) that belong to a panel.
  void record(const std::map<std::string, double>& metrics, int64_t step);
  bool empty() const { return series_.empty(); }
  void clear() { series_.clear(); }
  // "Loss", "Accuracy" and "Learning rate", each with its series in name order.
  std::vector<PlotPanel> panels() const;
  // write_svg_panels(path, panels()); throws kiln::Error when it cannot be written.
  void write(const std::string& path) const;

 private:
  std::map<std::string, PlotSeries> series_;  // by metric name
};

}  // namespace kiln
