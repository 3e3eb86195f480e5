// Line plots written as standalone SVG files, with no plotting dependency:
// the learning-rate finder draws its loss curve with it (Lightning's
// lr_finder.plot, which needs matplotlib, draws the same picture), and every
// run's training curves are panels of several lines (trainer/training_curves.h).
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

// Several named lines in one panel (a legend names them by colour).
struct PlotSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
};
struct PlotPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<PlotSeries> series;
  bool log_y = false;  // a log10 y axis (points with y <= 0 are left out)
};

// Writes `panels` one above the other (matplotlib's subplots(n, 1)) to `path`
// as SVG, each with its axes, ticks, one polyline per run of plottable points
// of each series, and a legend; a panel without points says "no data".
// Atomic (a temporary file renamed over `path`): a viewer that reloads the
// picture while training rewrites it never sees half of one. Throws kiln::Error
// when a series' x and y differ in length or the file cannot be written.
void write_svg_panels(const std::string& path, const std::vector<PlotPanel>& panels);

}  // namespace kiln
