#include "trainer/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "kernels/error.h"

namespace kiln {

namespace {

// Canvas and plot area, in SVG user units (pixels).
constexpr double kWidth = 640, kHeight = 480;
constexpr double kLeft = 80, kRight = 620, kTop = 40, kBottom = 420;

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), pattern, value);
  return buffer;
}

struct Range {
  double lo = 0, hi = 1;
};

// Data range padded as matplotlib's default 5% margins; a single value gets a unit-wide range.
Range padded_range(const std::vector<double>& values, double margin) {
  Range range{values.front(), values.front()};
  for (double v : values) {
    range.lo = std::min(range.lo, v);
    range.hi = std::max(range.hi, v);
  }
  if (range.hi - range.lo <= 0) {
    const double half = std::max(std::abs(range.lo) * 0.05, 0.5);
    return {range.lo - half, range.hi + half};
  }
  const double pad = (range.hi - range.lo) * margin;
  return {range.lo - pad, range.hi + pad};
}

// About five ticks at 1, 2 or 5 times a power of ten.
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

}  // namespace

void write_svg_line_plot(const std::string& path, const LinePlot& plot) {
  KILN_CHECK(plot.x.size() == plot.y.size(), "write_svg_line_plot: ", plot.x.size(), " x values but ", plot.y.size(),
             " y values");
  KILN_CHECK(!plot.marker || *plot.marker < plot.x.size(), "write_svg_line_plot: marker index ",
             plot.marker.value_or(0), " is outside the ", plot.x.size(), " points");
  auto plottable = [&](size_t i) {
    return std::isfinite(plot.x[i]) && std::isfinite(plot.y[i]) && (!plot.log_x || plot.x[i] > 0);
  };
  auto axis_x = [&](double x) { return plot.log_x ? std::log10(x) : x; };
  std::vector<double> xs, ys;
  for (size_t i = 0; i < plot.x.size(); ++i) {
    if (!plottable(i)) continue;
    xs.push_back(axis_x(plot.x[i]));
    ys.push_back(plot.y[i]);
  }
  const Range x_range = xs.empty() ? Range{} : padded_range(xs, 0.05);
  const Range y_range = ys.empty() ? Range{} : padded_range(ys, 0.05);
  auto to_px = [&](double axis_value) {
    return kLeft + (axis_value - x_range.lo) / (x_range.hi - x_range.lo) * (kRight - kLeft);
  };
  auto to_py = [&](double y) { return kBottom - (y - y_range.lo) / (y_range.hi - y_range.lo) * (kBottom - kTop); };
  auto point = [&](size_t i) {
    return format("%.2f", to_px(axis_x(plot.x[i]))) + "," + format("%.2f", to_py(plot.y[i]));
  };

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!plot.title.empty()) {
    svg << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">"
        << escape_xml(plot.title) << "</text>\n";
  }
  // Ticks: decades on a log axis (1e-8, 1e-7, ...), else 1/2/5 steps.
  std::vector<double> x_ticks;
  if (plot.log_x) {
    for (double decade = std::ceil(x_range.lo); decade <= std::floor(x_range.hi); decade += 1)
      x_ticks.push_back(decade);
    if (x_ticks.empty()) x_ticks = linear_ticks(x_range);
  } else {
    x_ticks = linear_ticks(x_range);
  }
  svg << "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double tick : x_ticks) {
    svg << "<line x1=\"" << format("%.2f", to_px(tick)) << "\" y1=\"" << kTop << "\" x2=\""
        << format("%.2f", to_px(tick)) << "\" y2=\"" << kBottom << "\"/>\n";
  }
  for (double tick : linear_ticks(y_range)) {
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << format("%.2f", to_py(tick)) << "\" x2=\"" << kRight << "\" y2=\""
        << format("%.2f", to_py(tick)) << "\"/>\n";
  }
  svg << "</g>\n<g text-anchor=\"middle\">\n";
  for (double tick : x_ticks) {
    const std::string label = plot.log_x ? format("1e%.0f", tick) : format("%g", tick);
    svg << "<text x=\"" << format("%.2f", to_px(tick)) << "\" y=\"" << kBottom + 18 << "\">" << label << "</text>\n";
  }
  svg << "</g>\n<g text-anchor=\"end\">\n";
  for (double tick : linear_ticks(y_range)) {
    svg << "<text x=\"" << kLeft - 6 << "\" y=\"" << format("%.2f", to_py(tick) + 4) << "\">" << format("%g", tick)
        << "</text>\n";
  }
  svg << "</g>\n"
      << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kRight - kLeft << "\" height=\""
      << kBottom - kTop << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kHeight - 16 << "\" text-anchor=\"middle\">"
      << escape_xml(plot.x_label) << "</text>\n"
      << "<text x=\"20\" y=\"" << (kTop + kBottom) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      << (kTop + kBottom) / 2 << ")\">" << escape_xml(plot.y_label) << "</text>\n";
  // The curve: one polyline per run of plottable points.
  std::string run;
  auto flush = [&] {
    if (!run.empty())
      svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"" << run << "\"/>\n";
    run.clear();
  };
  for (size_t i = 0; i < plot.x.size(); ++i) {
    if (!plottable(i)) {
      flush();
      continue;
    }
    run += (run.empty() ? "" : " ") + point(i);
  }
  flush();
  if (plot.marker && plottable(*plot.marker)) {
    const size_t i = *plot.marker;
    svg << "<circle cx=\"" << format("%.2f", to_px(axis_x(plot.x[i]))) << "\" cy=\"" << format("%.2f", to_py(plot.y[i]))
        << "\" r=\"5\" fill=\"red\"/>\n";
  }
  svg << "</svg>\n";

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(out.good(), "write_svg_line_plot: cannot open '", path, "' for writing");
  out << svg.str();
  out.close();
  KILN_CHECK(out.good(), "write_svg_line_plot: writing '", path, "' failed");
}

}  // namespace kiln
