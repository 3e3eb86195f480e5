#include "trainer/csv_logger.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/error.h"

namespace kiln {

namespace fs = std::filesystem;

CSVLogger::CSVLogger(const std::string& root_dir, const std::string& name) {
  const fs::path base = fs::path(root_dir) / name;
  std::error_code error;
  fs::create_directories(base, error);
  KILN_CHECK(!error, "CSVLogger: cannot create '", base.string(), "': ", error.message());
  while (fs::exists(base / ("version_" + std::to_string(version_)))) ++version_;
  const fs::path folder = base / ("version_" + std::to_string(version_));
  fs::create_directories(folder, error);
  KILN_CHECK(!error, "CSVLogger: cannot create '", folder.string(), "': ", error.message());
  log_dir_ = folder.string();
  columns_ = {"epoch", "step"};
}

void CSVLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) {
  std::map<std::string, std::string> row;
  row["epoch"] = std::to_string(epoch);
  row["step"] = std::to_string(step);
  for (const auto& [key, value] : metrics) {
    std::ostringstream text;
    text.precision(9);
    text << value;
    row[key] = text.str();
    // Lightning's _ExperimentWriter keeps the columns sorted (epoch and step among them).
    auto at = std::lower_bound(columns_.begin(), columns_.end(), key);
    if (at == columns_.end() || *at != key) columns_.insert(at, key);
  }
  rows_.push_back(std::move(row));
}

void CSVLogger::log_hyperparams(const std::map<std::string, std::string>& hparams) {
  const fs::path path = fs::path(log_dir_) / "hparams.yaml";
  std::ofstream out(path);
  KILN_CHECK(out.is_open(), "CSVLogger: cannot write '", path.string(), "'");
  if (hparams.empty()) out << "{}\n";
  for (const auto& [key, value] : hparams) out << key << ": " << value << "\n";
}

void CSVLogger::save() {
  const fs::path path = fs::path(log_dir_) / "metrics.csv";
  const fs::path temporary = fs::path(log_dir_) / "metrics.csv.tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    KILN_CHECK(out.is_open(), "CSVLogger: cannot write '", temporary.string(), "'");
    for (size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << columns_[i];
    out << "\n";
    for (const auto& row : rows_) {
      for (size_t i = 0; i < columns_.size(); ++i) {
        auto it = row.find(columns_[i]);
        out << (i ? "," : "") << (it == row.end() ? "" : it->second);
      }
      out << "\n";
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  KILN_CHECK(!error, "CSVLogger: cannot rename '", temporary.string(), "': ", error.message());
}

}  // namespace kiln
