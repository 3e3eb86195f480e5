// What the SVG (plot_svg.h) and the raster (plot_raster.h) drawings of a plot
// share: which points are drawn, the axes' padded ranges and ticks, and where
// a value lands in the plot area. One place, so the two pictures agree.
#pragma once

#include <cstddef>
#include <vector>

#include "trainer/plot_svg.h"

namespace kiln::plot {

struct Range {
  double lo = 0, hi = 1;
};

// The values' range with matplotlib's default 5% margins; a single value gets
// a unit-wide range. `values` must not be empty.
Range padded_range(const std::vector<double>& values, double margin = 0.05);

// About five ticks at 1, 2 or 5 times a power of ten.
std::vector<double> linear_ticks(const Range& range);

// Decades (whole log10 values) on a log axis when the range holds any, else linear_ticks.
std::vector<double> axis_ticks(const Range& range, bool log_axis);

// A LinePlot laid out in the rectangle [left, right] x [top, bottom] (pixels,
// y down): a point is drawn when x and y are finite (and x > 0 on a log x
// axis); the ranges cover the drawn points.
class LinePlotFrame {
 public:
  // Throws kiln::Error naming `who` when x and y differ in length or the
  // marker is not one of the points.
  LinePlotFrame(const LinePlot& plot, const char* who, double left, double right, double top, double bottom);

  bool drawn(size_t i) const;
  // Pixel coordinates of point i, and of an x axis value (log10 on a log axis) and a y value.
  double px(size_t i) const { return axis_px(axis_x(plot_.x[i])); }
  double py(size_t i) const { return value_py(plot_.y[i]); }
  double axis_px(double axis_value) const;
  double value_py(double y) const;
  const std::vector<double>& x_ticks() const { return x_ticks_; }
  const std::vector<double>& y_ticks() const { return y_ticks_; }

 private:
  double axis_x(double x) const;

  const LinePlot& plot_;
  double left_, right_, top_, bottom_;
  Range x_range_, y_range_;
  std::vector<double> x_ticks_, y_ticks_;
};

}  // namespace kiln::plot
