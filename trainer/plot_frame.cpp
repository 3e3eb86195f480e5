#include "trainer/plot_frame.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"

namespace kiln::plot {

Range padded_range(const std::vector<double>& values, double margin) {
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  if (*hi - *lo <= 0) {
    const double half = std::max(std::abs(*lo) * 0.05, 0.5);
    return {*lo - half, *hi + half};
  }
  const double pad = (*hi - *lo) * margin;
  return {*lo - pad, *hi + pad};
}

std::vector<double> linear_ticks(const Range& range) {
  const double raw = (range.hi - range.lo) / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalized = raw / magnitude;
  const double step = (normalized < 1.5 ? 1 : normalized < 3 ? 2 : normalized < 7 ? 5 : 10) * magnitude;
  std::vector<double> ticks;
  for (double tick = std::ceil(range.lo / step) * step; tick <= range.hi + 1e-9 * step; tick += step) {
    ticks.push_back(std::abs(tick) < 1e-12 * step ? 0.0 : tick);
  }
  return ticks;
}

std::vector<double> axis_ticks(const Range& range, bool log_axis) {
  std::vector<double> ticks;
  if (log_axis) {
    for (double decade = std::ceil(range.lo); decade <= std::floor(range.hi); decade += 1) ticks.push_back(decade);
  }
  return ticks.empty() ? linear_ticks(range) : ticks;
}

LinePlotFrame::LinePlotFrame(const LinePlot& plot, const char* who, double left, double right, double top,
                             double bottom)
    : plot_(plot), left_(left), right_(right), top_(top), bottom_(bottom) {
  KILN_CHECK(plot.x.size() == plot.y.size(), who, ": ", plot.x.size(), " x values but ", plot.y.size(),
             " y values");
  KILN_CHECK(!plot.marker || *plot.marker < plot.x.size(), who, ": marker index ", plot.marker.value_or(0),
             " is outside the ", plot.x.size(), " points");
  std::vector<double> xs, ys;
  for (size_t i = 0; i < plot.x.size(); ++i) {
    if (!drawn(i)) continue;
    xs.push_back(axis_x(plot.x[i]));
    ys.push_back(plot.y[i]);
  }
  if (!xs.empty()) {
    x_range_ = padded_range(xs);
    y_range_ = padded_range(ys);
  }
  x_ticks_ = axis_ticks(x_range_, plot.log_x);
  y_ticks_ = linear_ticks(y_range_);
}

bool LinePlotFrame::drawn(size_t i) const {
  return std::isfinite(plot_.x[i]) && std::isfinite(plot_.y[i]) && (!plot_.log_x || plot_.x[i] > 0);
}

double LinePlotFrame::axis_x(double x) const { return plot_.log_x ? std::log10(x) : x; }

double LinePlotFrame::axis_px(double axis_value) const {
  return left_ + (axis_value - x_range_.lo) / (x_range_.hi - x_range_.lo) * (right_ - left_);
}

double LinePlotFrame::value_py(double y) const {
  return bottom_ - (y - y_range_.lo) / (y_range_.hi - y_range_.lo) * (bottom_ - top_);
}

}  // namespace kiln::plot
