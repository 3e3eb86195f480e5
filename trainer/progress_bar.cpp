#include "trainer/progress_bar.h"

#include <unistd.h>

#include <algorithm>

namespace kiln {

void ProgressBar::reset(bool enabled, std::FILE* stream) {
  enabled_ = enabled;
  stream_ = stream;
  terminal_ = enabled && ::isatty(::fileno(stream)) == 1;
  metrics_.clear();
  line_open_ = false;
}

void ProgressBar::start_epoch(int64_t epoch, int64_t total_batches, int64_t done) {
  epoch_ = epoch;
  total_ = total_batches;
  first_done_ = done;
  epoch_start_ = std::chrono::steady_clock::now();
}

void ProgressBar::set_metrics(const std::map<std::string, double>& metrics) {
  for (const auto& [name, value] : metrics) metrics_[name] = value;
}

void ProgressBar::batch_end(int64_t done) {
  if (!enabled_) return;
  // Off a terminal every line stays in the log: a tenth of the epoch apart.
  const bool due = terminal_ || done == total_ || done % std::max<int64_t>(1, total_ / 10) == 0;
  if (due) print(done);
}

void ProgressBar::end_epoch() {
  if (!enabled_ || !line_open_) return;
  std::fputc('\n', stream_);
  std::fflush(stream_);
  line_open_ = false;
}

void ProgressBar::print(int64_t done) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start_).count();
  const double rate = static_cast<double>(done - first_done_) / std::max(seconds, 1e-9);
  const double eta = static_cast<double>(total_ - done) / std::max(rate, 1e-9);
  std::fprintf(stream_, "%sEpoch %lld: %lld/%lld [%.1f it/s, eta %.0fs]", terminal_ ? "\r" : "",
               static_cast<long long>(epoch_), static_cast<long long>(done), static_cast<long long>(total_), rate, eta);
  for (const auto& [name, value] : metrics_) std::fprintf(stream_, " %s=%.4f", name.c_str(), value);
  // On a terminal the spaces cover the end of a longer previous line.
  std::fputs(terminal_ ? "   " : "\n", stream_);
  std::fflush(stream_);
  line_open_ = terminal_;
}

}  // namespace kiln
