#include "core/profiler.h"

#include <algorithm>
#include <cstdio>

#include "core/autograd.h"
#include "kernels/error.h"

// nvtx3 is header-only (it finds an attached tool at run time through
// NVTX_INJECTION64_PATH), so it needs no library, only the toolkit's headers.
#if KILN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace kiln {

void nvtx_range_push(const char* name) {
#if KILN_WITH_CUDA
  nvtxRangePushA(name);
#else
  (void)name;
#endif
}

void nvtx_range_pop() {
#if KILN_WITH_CUDA
  nvtxRangePop();
#endif
}

namespace {

thread_local OpProfiler* active_profiler = nullptr;

// Resolving events in batches keeps the pending list short on long runs
// without waiting for the device.
constexpr size_t kResolveBatch = 1024;

// torch.profiler's time format.
std::string format_time(double seconds) {
  char text[32];
  const double us = seconds * 1e6;
  if (us >= 1e6) {
    std::snprintf(text, sizeof text, "%.3fs", us / 1e6);
  } else if (us >= 1e3) {
    std::snprintf(text, sizeof text, "%.3fms", us / 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.3fus", us);
  }
  return text;
}

std::string format_percent(double part, double whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

// Rows of cells under a header, columns padded to their widest cell and
// framed by dashed lines (the layout of torch.profiler's tables).
std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size());
  for (size_t c = 0; c < header.size(); ++c) widths[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  size_t line_width = 2 * (widths.size() - 1);
  for (size_t width : widths) line_width += width;
  const std::string rule(line_width, '-');
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      // The name column is left-aligned, numbers right-aligned.
      const std::string padding(widths[c] - cells[c].size(), ' ');
      if (c > 0) text += "  ";
      text += c == 0 ? cells[c] + padding : padding + cells[c];
    }
    return text + "\n";
  };
  std::string out = rule + "\n" + line(header) + rule + "\n";
  for (const auto& row : rows) out += line(row);
  return out + rule + "\n";
}

}  // namespace

OpProfiler* active_op_profiler() { return active_profiler; }

OpProfiler::~OpProfiler() {
  if (active_) active_profiler = nullptr;
  for (const Pending& pending : pending_) {
    cuda::destroy_event(pending.start_event);
    cuda::destroy_event(pending.end_event);
  }
  for (const auto& [device, events] : free_events_) {
    for (cuda::Event event : events) cuda::destroy_event(event);
  }
}

void OpProfiler::start() {
  KILN_CHECK(active_profiler == nullptr, "OpProfiler::start: another op profiler is already active on this thread");
  active_profiler = this;
  active_ = true;
}

void OpProfiler::stop() {
  if (!active_) return;
  KILN_CHECK(active_profiler == this, "OpProfiler::stop: called from a thread other than the one that started it");
  active_profiler = nullptr;
  active_ = false;
}

bool OpProfiler::active() const { return active_; }

void OpProfiler::reset() {
  resolve_pending(/*wait=*/true);
  ops_.clear();
  ranges_.clear();
}

cuda::Event OpProfiler::take_event(int device) {
  std::vector<cuda::Event>& events = free_events_[device];
  if (events.empty()) return cuda::create_event(device, /*timing=*/true);
  cuda::Event event = events.back();
  events.pop_back();
  return event;
}

OpProfiler::Interval OpProfiler::begin(std::string name, Kind kind, Device device) {
  Interval interval{std::move(name), kind, device, {}, nullptr};
  if (device.is_cuda()) {
    interval.start_event = take_event(device.index);
    cuda::record_event(interval.start_event, cuda::current_stream(device.index));
  }
  interval.start = std::chrono::steady_clock::now();
  return interval;
}

void OpProfiler::end(Interval interval) {
  const double cpu_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - interval.start).count();
  if (interval.kind == Kind::backward_node) {
    OpStats& stats = ops_[interval.name];
    stats.name = interval.name;
    ++stats.backward_calls;
    stats.backward_cpu_seconds += cpu_seconds;
  } else {
    RangeStats& stats = ranges_[interval.name];
    stats.name = interval.name;
    ++stats.calls;
    stats.cpu_seconds += cpu_seconds;
  }
  if (interval.start_event != nullptr) {
    cuda::Event end_event = take_event(interval.device.index);
    cuda::record_event(end_event, cuda::current_stream(interval.device.index));
    pending_.push_back({std::move(interval.name), interval.kind, interval.device.index, interval.start_event, end_event});
    if (pending_.size() >= kResolveBatch) resolve_pending(/*wait=*/false);
  }
}

void OpProfiler::count_forward(const char* name) {
  OpStats& stats = ops_[name];
  if (stats.name.empty()) stats.name = name;
  ++stats.forward_calls;
}

void OpProfiler::resolve_pending(bool wait) {
  std::vector<Pending> still_pending;
  for (Pending& pending : pending_) {
    if (!wait && !cuda::event_query(pending.end_event)) {
      still_pending.push_back(pending);
      continue;
    }
    cuda::event_synchronize(pending.end_event);
    const double seconds = cuda::event_elapsed_ms(pending.start_event, pending.end_event) / 1e3;
    if (pending.kind == Kind::backward_node) {
      ops_[pending.name].backward_cuda_seconds += seconds;
    } else {
      ranges_[pending.name].cuda_seconds += seconds;
    }
    free_events_[pending.device].push_back(pending.start_event);
    free_events_[pending.device].push_back(pending.end_event);
  }
  pending_ = std::move(still_pending);
}

std::vector<OpStats> OpProfiler::op_stats() {
  resolve_pending(/*wait=*/true);
  std::vector<OpStats> stats;
  for (const auto& [name, entry] : ops_) stats.push_back(entry);
  std::stable_sort(stats.begin(), stats.end(), [](const OpStats& a, const OpStats& b) {
    if (a.backward_cuda_seconds != b.backward_cuda_seconds) return a.backward_cuda_seconds > b.backward_cuda_seconds;
    return a.backward_cpu_seconds > b.backward_cpu_seconds;
  });
  return stats;
}

std::vector<RangeStats> OpProfiler::range_stats() {
  resolve_pending(/*wait=*/true);
  std::vector<RangeStats> stats;
  for (const auto& [name, entry] : ranges_) stats.push_back(entry);
  std::stable_sort(stats.begin(), stats.end(), [](const RangeStats& a, const RangeStats& b) {
    if (a.cuda_seconds != b.cuda_seconds) return a.cuda_seconds > b.cuda_seconds;
    return a.cpu_seconds > b.cpu_seconds;
  });
  return stats;
}

std::string OpProfiler::table(int row_limit) {
  const std::vector<OpStats> ops = op_stats();
  const std::vector<RangeStats> ranges = range_stats();
  auto limited = [row_limit](size_t count) { return row_limit < 0 ? count : std::min<size_t>(count, row_limit); };
  bool any_cuda = false;
  double backward_cpu = 0, backward_cuda = 0;
  for (const OpStats& op : ops) {
    backward_cpu += op.backward_cpu_seconds;
    backward_cuda += op.backward_cuda_seconds;
  }
  for (const RangeStats& range : ranges) any_cuda = any_cuda || range.cuda_seconds > 0;
  any_cuda = any_cuda || backward_cuda > 0;

  std::string out;
  if (!ops.empty()) {
    std::vector<std::string> header = {"Op (autograd node)", "Forward calls", "Backward calls", "Backward CPU total",
                                       "Backward CPU %", "Backward CPU avg"};
    if (any_cuda) header.insert(header.end(), {"Backward CUDA total", "Backward CUDA %", "Backward CUDA avg"});
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < limited(ops.size()); ++i) {
      const OpStats& op = ops[i];
      const double calls = static_cast<double>(std::max<int64_t>(op.backward_calls, 1));
      std::vector<std::string> row = {op.name,
                                      std::to_string(op.forward_calls),
                                      std::to_string(op.backward_calls),
                                      format_time(op.backward_cpu_seconds),
                                      format_percent(op.backward_cpu_seconds, backward_cpu),
                                      format_time(op.backward_cpu_seconds / calls)};
      if (any_cuda) {
        row.insert(row.end(), {format_time(op.backward_cuda_seconds),
                               format_percent(op.backward_cuda_seconds, backward_cuda),
                               format_time(op.backward_cuda_seconds / calls)});
      }
      rows.push_back(std::move(row));
    }
    out += render_table(header, rows);
    out += "Backward CPU time total: " + format_time(backward_cpu) + "\n";
    if (any_cuda) out += "Backward CUDA time total: " + format_time(backward_cuda) + "\n";
  }
  if (!ranges.empty()) {
    std::vector<std::string> header = {"Range", "Calls", "CPU total", "CPU avg"};
    if (any_cuda) header.insert(header.end(), {"CUDA total", "CUDA avg"});
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < limited(ranges.size()); ++i) {
      const RangeStats& range = ranges[i];
      const double calls = static_cast<double>(std::max<int64_t>(range.calls, 1));
      std::vector<std::string> row = {range.name, std::to_string(range.calls), format_time(range.cpu_seconds),
                                      format_time(range.cpu_seconds / calls)};
      if (any_cuda) row.insert(row.end(), {format_time(range.cuda_seconds), format_time(range.cuda_seconds / calls)});
      rows.push_back(std::move(row));
    }
    if (!out.empty()) out += "\n";
    out += render_table(header, rows);
  }
  return out;
}

// ---------------------------------------------------------------- scopes

RecordFunction::RecordFunction(std::string name, Device device) : profiler_(active_op_profiler()) {
  nvtx_range_push(name.c_str());
  if (profiler_ != nullptr) interval_ = profiler_->begin(std::move(name), OpProfiler::Kind::range, device);
}

RecordFunction::~RecordFunction() {
  // A profiler must never end the program from a destructor: a failed event
  // record drops this one measurement, and the CUDA error resurfaces at the
  // next checked call.
  try {
    if (profiler_ != nullptr && profiler_ == active_op_profiler()) profiler_->end(std::move(interval_));
  } catch (const std::exception&) {
  }
  nvtx_range_pop();
}

void BackwardNodeScope::begin(const autograd::Node& node) {
  const Device device = node.outputs.empty() ? Device::cpu() : node.outputs.front().device;
  interval_ = profiler_->begin(node.name(), OpProfiler::Kind::backward_node, device);
  nvtx_range_push((interval_.name + "_backward").c_str());
}

void BackwardNodeScope::end() {
  nvtx_range_pop();
  try {  // as in ~RecordFunction
    if (profiler_ == active_op_profiler()) profiler_->end(std::move(interval_));
  } catch (const std::exception&) {
  }
}

}  // namespace kiln
