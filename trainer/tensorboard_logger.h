// TensorBoardLogger in Lightning's layout:
//   <root>/lightning_logs/version_N/events.out.tfevents.<time>.<host>.<pid>.<n>
// plus hparams.yaml. The event file is what TensorBoard reads: TFRecord
// framing (length, masked CRC32C of the length, data, masked CRC32C of the
// data) around hand-encoded protobuf `Event` messages: first a file_version
// "brain.Event:2" event, then one Summary of simple_value scalars per
// log_metrics call, the hyperparameters as an hparams-plugin summary
// (TensorBoard's HPARAMS tab), and torch's SummaryWriter add_image (a PNG in a
// Summary.Image) and add_histogram (a HistogramProto in TensorFlow's default
// buckets). The file is only ever appended to, so a crashed run leaves a
// prefix of whole records that TensorBoard still reads.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "trainer/logger.h"

namespace kiln {

class Trainer;

class TensorBoardLogger : public Logger {
 public:
  // Writes into <root_dir>/<name>/version_<version>; without a version, the
  // next free version_N (CSVLogger's numbering: the first N with no folder
  // yet). Pass CSVLogger::version() to share its folder. The folder and a new
  // event file are made at first use (log_dir(), version(), event_file() or a
  // log call), as Lightning's logger makes its experiment lazily: a program
  // that fails before it logs, or a rank whose Trainer never logs, leaves
  // nothing behind. Buffered events are flushed by save(), the destructor, and
  // any log call that comes flush_secs after the last flush (Lightning's
  // SummaryWriter default, 120 s). Throws kiln::Error for a negative version,
  // and at first use when the folder or file cannot be made.
  explicit TensorBoardLogger(const std::string& root_dir, const std::string& name = "lightning_logs",
                             std::optional<int> version = std::nullopt, double flush_secs = 120.0);
  ~TensorBoardLogger() override;
  TensorBoardLogger(const TensorBoardLogger&) = delete;
  TensorBoardLogger& operator=(const TensorBoardLogger&) = delete;

  const std::string& log_dir() const override;
  int version() const;
  // The event file being written.
  const std::string& event_file() const;
  // One event at `step` with a simple_value scalar per metric, plus "epoch"
  // (as Lightning adds it to every logged row).
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) override;
  // Writes hparams.yaml and an hparams-plugin session_start_info summary;
  // values that parse as numbers or true/false are typed as such.
  void log_hyperparams(const std::map<std::string, std::string>& hparams) override;
  // Flushes and fsyncs the event file: everything logged so far is on disk.
  void save() override;

  // One event at `step` with a Summary.Image of `pixels` ((height, width,
  // channels) row-major bytes; channels 1: grayscale, 3: RGB) encoded as PNG.
  // Throws kiln::Error for an empty tag, a side below 1, null pixels or
  // another channel count.
  void log_image(const std::string& tag, int64_t width, int64_t height, int channels, const uint8_t* pixels,
                 int64_t step);
  // torch's SummaryWriter.add_image(tag, img_tensor, global_step, dataformats):
  // `image` is "CHW" (the default), "HWC" or "HW", with 1 or 3 channels, any
  // device. Floating values are scaled by 255, clipped to [0, 255] and
  // truncated as torch does (NaN gives 0); uint8 values are taken as they are.
  // Throws kiln::Error for an undefined or empty tensor, dims that do not match
  // dataformats, another channel count or dtype. Synchronizes the device.
  void log_image(const std::string& tag, const Tensor& image, int64_t step, const std::string& dataformats = "CHW");

  // torch's SummaryWriter.add_histogram with its default bins: one event at
  // `step` with a HistogramProto of min, max, num, sum, sum_squares and the
  // counts in TensorFlow's default buckets (limits 0, ±1e-12 * 1.1^k below
  // 1e20, and DBL_MAX), each run of empty buckets merged into one as
  // TensorFlow's writer does. `values` of any shape, dtype (bool excepted) and
  // device are read to the host as float64. Non-finite values are refused
  // rather than binned (numpy would drop them from the buckets but not from
  // num, min or max, a histogram TensorBoard cannot draw): kiln::Error names
  // how many there are, as it does for an empty tensor or tag. Synchronizes the device.
  void log_histogram(const std::string& tag, const Tensor& values, int64_t step);
  void log_histogram(const std::string& tag, const std::vector<double>& values, int64_t step);

 private:
  // Claims the version folder and starts the event file with its header, once.
  void open() const;
  void write_event(const std::string& event);
  // An Event holding `summary` at `step`, flushed when flush_secs have passed.
  void write_summary(int64_t step, const std::string& summary);
  void flush(bool sync);

  std::string root_dir_, name_;
  std::optional<int> requested_version_;
  double flush_secs_;
  // Set by open() at first use, which log_dir() (const in Logger) may be.
  mutable std::string log_dir_;
  mutable std::string event_file_;
  mutable int version_ = 0;
  mutable std::FILE* file_ = nullptr;
  mutable std::chrono::steady_clock::time_point last_flush_;
};

// The TensorBoardLogger the Trainer writes to, or null: none among its
// loggers, logging off (logger false or fast_dev_run), or a rank other than 0.
TensorBoardLogger* find_tensorboard_logger(const Trainer& trainer);

}  // namespace kiln
