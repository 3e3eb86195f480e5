#include "trainer/profiler.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "kernels/error.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// Python's f"{value:.5}" (Lightning formats its table with it): %.5g, but a
// float without exponent keeps one decimal ("2.0", not "2").
std::string python_float5(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.5g", value);
  std::string formatted = text;
  if (formatted.find_first_of(".ein") == std::string::npos) formatted += ".0";
  return formatted;
}

std::string pad_right(const std::string& text, size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

// The width of one line after Python's str.expandtabs() (tab stops every 8).
size_t expanded_width(const std::string& line) {
  size_t column = 0;
  for (char c : line) column = c == '\t' ? (column / 8 + 1) * 8 : column + 1;
  return column;
}

}  // namespace

// ---------------------------------------------------------------- Profiler

Profiler::Profiler(std::string dirpath, std::string filename)
    : dirpath_(std::move(dirpath)), filename_(std::move(filename)) {}

Profiler::Scope::Scope(Profiler& profiler, std::string action_name)
    : profiler_(profiler), action_name_(std::move(action_name)) {
  nvtx_range_push(action_name_.c_str());
  try {
    profiler_.start(action_name_);
  } catch (...) {
    nvtx_range_pop();
    throw;
  }
}

Profiler::Scope::~Scope() {
  // stop() fails only when the action was stopped by hand inside the scope;
  // a destructor must not throw, and the measurement is already taken then.
  try {
    profiler_.stop(action_name_);
  } catch (const std::exception&) {
  }
  nvtx_range_pop();
}

void Profiler::setup(const std::string& stage, const std::string& log_dir) {
  stage_ = stage;
  if (dirpath_.empty()) dirpath_ = log_dir;
}

void Profiler::describe() {
  const std::string report = summary();
  if (!report.empty()) {
    if (!filename_.empty() && !dirpath_.empty()) {
      // Lightning's _prepare_filename: "<stage>-<filename>.txt", appended to.
      const fs::path path = fs::path(dirpath_) / ((stage_.empty() ? "" : stage_ + "-") + filename_ + ".txt");
      std::error_code error;
      fs::create_directories(dirpath_, error);
      KILN_CHECK(!error, "Profiler: cannot create '", dirpath_, "': ", error.message());
      std::ofstream out(path, std::ios::app);
      KILN_CHECK(out.is_open(), "Profiler: cannot write '", path.string(), "'");
      out << report;
    } else {
      std::cout << report << std::flush;
    }
  }
  teardown();
}

// ---------------------------------------------------------------- SimpleProfiler

SimpleProfiler::SimpleProfiler(std::string dirpath, std::string filename, bool extended)
    : Profiler(std::move(dirpath), std::move(filename)), extended_(extended),
      created_(std::chrono::steady_clock::now()) {}

void SimpleProfiler::start(const std::string& action_name) {
  KILN_CHECK(running_.find(action_name) == running_.end(), "SimpleProfiler: attempted to start ", action_name,
             " which has already started");
  running_[action_name] = std::chrono::steady_clock::now();
}

void SimpleProfiler::stop(const std::string& action_name) {
  const auto end = std::chrono::steady_clock::now();
  auto it = running_.find(action_name);
  KILN_CHECK(it != running_.end(), "SimpleProfiler: attempting to stop recording an action (", action_name,
             ") which was never started");
  ActionStats& stats = recorded_[action_name];
  stats.name = action_name;
  ++stats.calls;
  stats.total_seconds += std::chrono::duration<double>(end - it->second).count();
  running_.erase(it);
}

std::vector<ActionStats> SimpleProfiler::stats() const {
  std::vector<ActionStats> sorted;
  for (const auto& [name, stats] : recorded_) sorted.push_back(stats);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const ActionStats& a, const ActionStats& b) { return a.total_seconds > b.total_seconds; });
  return sorted;
}

// Lightning's SimpleProfiler.summary(), character for character.
std::string SimpleProfiler::summary() {
  std::string out;
  if (!stage_.empty()) {
    std::string upper = stage_;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
    out += upper + " ";
  }
  out += "Profiler Report\n";
  const std::vector<ActionStats> report = stats();
  if (report.empty()) return out + "\n";
  size_t max_key = 0;
  for (const ActionStats& action : report) max_key = std::max(max_key, action.name.size());

  auto row = [&](const std::vector<std::string>& cells) {
    std::string line = "|  " + pad_right(cells[0], max_key) + "\t|";
    for (size_t i = 1; i < cells.size(); ++i) line += "  " + pad_right(cells[i], 15) + "\t|";
    return line;
  };
  std::vector<std::string> header = {"Action", "Mean duration (s)", "Total time (s)"};
  if (extended_) header = {"Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %"};
  const std::string header_line = row(header);
  // Lightning measures the rule as len(header.expandtabs()) with the leading
  // line separator included, so it is one dash longer than the header.
  const std::string rule = "\n" + std::string(expanded_width(header_line) + 1, '-');
  out += rule + "\n" + header_line + rule;
  if (extended_) {
    const double total_duration = std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
    int64_t total_calls = 0;
    for (const ActionStats& action : report) total_calls += action.calls;
    out += "\n" + row({"Total", "-", std::to_string(total_calls), python_float5(total_duration), "100 %"});
    out += rule;
    for (const ActionStats& action : report) {
      out += "\n" + row({action.name, python_float5(action.mean_seconds()), std::to_string(action.calls),
                         python_float5(action.total_seconds),
                         python_float5(100.0 * action.total_seconds / total_duration)});
    }
  } else {
    // Lightning's short table is sorted by mean duration.
    std::vector<ActionStats> by_mean = report;
    std::stable_sort(by_mean.begin(), by_mean.end(),
                     [](const ActionStats& a, const ActionStats& b) { return a.mean_seconds() > b.mean_seconds(); });
    for (const ActionStats& action : by_mean) {
      out += "\n" + row({action.name, python_float5(action.mean_seconds()), python_float5(action.total_seconds)});
    }
  }
  return out + rule + "\n";
}

// ---------------------------------------------------------------- PyTorchProfiler

PyTorchProfiler::PyTorchProfiler(std::string dirpath, std::string filename, int row_limit, Device device)
    : Profiler(std::move(dirpath), std::move(filename)), row_limit_(row_limit), device_(device) {}

void PyTorchProfiler::setup(const std::string& stage, const std::string& log_dir) {
  Profiler::setup(stage, log_dir);
  op_profiler_.reset();  // one report per stage, as Lightning makes one torch profiler per stage
  if (!op_profiler_.active()) op_profiler_.start();
}

void PyTorchProfiler::teardown() { op_profiler_.stop(); }

void PyTorchProfiler::start(const std::string& action_name) {
  KILN_CHECK(running_.find(action_name) == running_.end(), "PyTorchProfiler: attempted to start ", action_name,
             " which has already started");
  running_[action_name] = op_profiler_.begin(action_name, OpProfiler::Kind::range, device_);
}

void PyTorchProfiler::stop(const std::string& action_name) {
  auto it = running_.find(action_name);
  KILN_CHECK(it != running_.end(), "PyTorchProfiler: attempting to stop recording an action (", action_name,
             ") which was never started");
  OpProfiler::Interval interval = std::move(it->second);
  running_.erase(it);
  op_profiler_.end(std::move(interval));
}

std::string PyTorchProfiler::summary() {
  const std::string tables = op_profiler_.table(row_limit_);
  if (tables.empty()) return "";
  std::string upper = stage_;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  return (upper.empty() ? "" : upper + " ") + "Profiler Report (kiln op profiler)\n" + tables;
}

ProfilerStage::ProfilerStage(Profiler& profiler, const std::string& stage, const std::string& log_dir)
    : profiler_(profiler) {
  profiler_.setup(stage, log_dir);
}

ProfilerStage::~ProfilerStage() {
  if (finished_) return;
  try {
    profiler_.teardown();
  } catch (const std::exception&) {  // already unwinding from the stage's own error
  }
}

void ProfilerStage::finish(bool report) {
  finished_ = true;
  if (report) {
    profiler_.describe();
  } else {
    profiler_.teardown();
  }
}

std::string class_name(const std::type_info& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : type.name();
  std::free(demangled);
  // Drop namespaces and enclosing classes, not the template arguments' (anonymous namespaces included).
  const size_t template_start = name.find('<');
  const size_t last_scope = name.rfind("::", template_start);
  if (last_scope != std::string::npos) name = name.substr(last_scope + 2);
  return name;
}

std::shared_ptr<Profiler> make_profiler(const std::string& name, Device device) {
  if (name.empty()) return std::make_shared<PassThroughProfiler>();
  if (name == "simple") return std::make_shared<SimpleProfiler>();
  if (name == "pytorch") return std::make_shared<PyTorchProfiler>("", "", 20, device);
  KILN_CHECK(name != "advanced",
             "profiler \"advanced\" (Lightning's cProfile-based AdvancedProfiler) has no kiln counterpart; use "
             "\"simple\" (time per trainer hook and step) or \"pytorch\" (kiln's op profiler)");
  KILN_THROW("unknown profiler '", name, "' (expected \"simple\" or \"pytorch\", or empty for none)");
}

}  // namespace kiln
