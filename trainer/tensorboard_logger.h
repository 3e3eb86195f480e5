// TensorBoardLogger in Lightning's layout:
//   <root>/lightning_logs/version_N/events.out.tfevents.<time>.<host>.<pid>.<n>
// plus hparams.yaml. The event file is what TensorBoard reads: TFRecord
// framing (length, masked CRC32C of the length, data, masked CRC32C of the
// data) around hand-encoded protobuf `Event` messages: first a file_version
// "brain.Event:2" event, then one Summary of simple_value scalars per
// log_metrics call, and the hyperparameters as an hparams-plugin summary
// (TensorBoard's HPARAMS tab). The file is only ever appended to, so a
// crashed run leaves a prefix of whole records that TensorBoard still reads.
#pragma once

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#include "trainer/logger.h"

namespace kiln {

class TensorBoardLogger : public Logger {
 public:
  // Opens a new event file in <root_dir>/<name>/version_<version>; without a
  // version, the next free version_N (CSVLogger's numbering: the first N with
  // no folder yet). Pass CSVLogger::version() to share its folder. Buffered
  // events are flushed by save(), the destructor, and any log_metrics call
  // that comes flush_secs after the last flush (Lightning's SummaryWriter
  // default, 120 s). Throws kiln::Error when the folder or file cannot be made.
  explicit TensorBoardLogger(const std::string& root_dir, const std::string& name = "lightning_logs",
                             std::optional<int> version = std::nullopt, double flush_secs = 120.0);
  ~TensorBoardLogger() override;
  TensorBoardLogger(const TensorBoardLogger&) = delete;
  TensorBoardLogger& operator=(const TensorBoardLogger&) = delete;

  const std::string& log_dir() const override { return log_dir_; }
  int version() const { return version_; }
  // The event file being written.
  const std::string& event_file() const { return event_file_; }
  // One event at `step` with a simple_value scalar per metric, plus "epoch"
  // (as Lightning adds it to every logged row).
  void log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) override;
  // Writes hparams.yaml and an hparams-plugin session_start_info summary;
  // values that parse as numbers or true/false are typed as such.
  void log_hyperparams(const std::map<std::string, std::string>& hparams) override;
  // Flushes and fsyncs the event file: everything logged so far is on disk.
  void save() override;

 private:
  void write_event(const std::string& event);
  void flush(bool sync);

  std::string log_dir_;
  std::string event_file_;
  int version_ = 0;
  std::FILE* file_ = nullptr;
  double flush_secs_;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace kiln
