// The Trainer's progress bar: Lightning's TQDMProgressBar in plain text, on
// stderr, during training epochs:
//
//   Epoch 3: 40/100 [52.1 it/s, eta 1s] train_loss=0.4213 val_acc=0.8810
//
// the epoch, the batches done of the epoch's batches, batches per second since
// the epoch began, the time the epoch still needs at that rate, and the latest
// value of every metric logged with prog_bar=true: step values when they are
// logged (every log_every_n_steps; reading them more often would stall the
// device, see DESIGN.md's sync-free step) and epoch values (a validation's
// val_loss) once computed, kept until replaced. On a terminal the line is
// rewritten after every batch; elsewhere (a log file) a line is printed at
// every tenth of the epoch and at its last batch. Disabled, it prints nothing:
// the Trainer disables it for enable_progress_bar=false and on every rank but
// global rank 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace kiln {

class ProgressBar {
 public:
  // Starts a fit: whether to print, and where (a terminal rewrites its line).
  // Forgets the metrics of an earlier fit.
  void reset(bool enabled, std::FILE* stream = stderr);
  bool enabled() const { return enabled_; }
  // An epoch of `total_batches` begins, `done` of them already trained (a
  // run resumed mid-epoch): the rate counts the batches trained from here.
  void start_epoch(int64_t epoch, int64_t total_batches, int64_t done);
  // Sets the shown value of each metric (others keep theirs).
  void set_metrics(const std::map<std::string, double>& metrics);
  // Forgets every shown value (the sanity check's, as Lightning resets them).
  void clear_metrics() { metrics_.clear(); }
  const std::map<std::string, double>& metrics() const { return metrics_; }
  // A training batch ended; `done` batches of the epoch are trained.
  void batch_end(int64_t done);
  // Ends a rewritten line with a newline.
  void end_epoch();

 private:
  void print(int64_t done);

  bool enabled_ = false;
  bool terminal_ = false;
  std::FILE* stream_ = stderr;
  int64_t epoch_ = 0, total_ = 0, first_done_ = 0;
  bool line_open_ = false;
  std::chrono::steady_clock::time_point epoch_start_;
  std::map<std::string, double> metrics_;
};

}  // namespace kiln
