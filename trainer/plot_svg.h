// A line plot written as a standalone SVG file, with no plotting dependency:
// the learning-rate finder draws its loss curve with it (Lightning's
// lr_finder.plot, which needs matplotlib, draws the same picture).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct LinePlot {
  std::vector<double> x;
  std::vector<double> y;
  bool log_x = false;  // a log10 x axis (points with x <= 0 are left out)
  std::string title;
  std::string x_label;
  std::string y_label;
  // Index of a point drawn as a red dot (Lightning marks the suggested lr so).
  std::optional<size_t> marker;
};

// Writes `plot` to `path` as SVG: axes with ticks and labels, one polyline
// per run of finite points (a NaN or inf breaks the line, as matplotlib does),
// the marker as a red <circle>. Throws kiln::Error when x and y differ in
// length, the marker is out of range, or the file cannot be written.
void write_svg_line_plot(const std::string& path, const LinePlot& plot);

}  // namespace kiln
