#include "trainer/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/error.h"
#include "trainer/plot_frame.h"

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

using plot::axis_ticks;
using plot::linear_ticks;
using plot::padded_range;
using plot::Range;

}  // namespace

void write_svg_line_plot(const std::string& path, const LinePlot& plot) {
  const plot::LinePlotFrame frame(plot, "write_svg_line_plot", kLeft, kRight, kTop, kBottom);
  auto to_px = [&](double axis_value) { return frame.axis_px(axis_value); };
  auto to_py = [&](double y) { return frame.value_py(y); };
  auto point = [&](size_t i) { return format("%.2f", frame.px(i)) + "," + format("%.2f", frame.py(i)); };

  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!plot.title.empty()) {
    svg << "<text x=\"" << (kLeft + kRight) / 2 << "\" y=\"24\" text-anchor=\"middle\" font-size=\"14\">"
        << escape_xml(plot.title) << "</text>\n";
  }
  const std::vector<double>& x_ticks = frame.x_ticks();
  svg << "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double tick : x_ticks) {
    svg << "<line x1=\"" << format("%.2f", to_px(tick)) << "\" y1=\"" << kTop << "\" x2=\""
        << format("%.2f", to_px(tick)) << "\" y2=\"" << kBottom << "\"/>\n";
  }
  for (double tick : frame.y_ticks()) {
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << format("%.2f", to_py(tick)) << "\" x2=\"" << kRight << "\" y2=\""
        << format("%.2f", to_py(tick)) << "\"/>\n";
  }
  svg << "</g>\n<g text-anchor=\"middle\">\n";
  for (double tick : x_ticks) {
    const std::string label = plot.log_x ? format("1e%.0f", tick) : format("%g", tick);
    svg << "<text x=\"" << format("%.2f", to_px(tick)) << "\" y=\"" << kBottom + 18 << "\">" << label << "</text>\n";
  }
  svg << "</g>\n<g text-anchor=\"end\">\n";
  for (double tick : frame.y_ticks()) {
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
    if (!frame.drawn(i)) {
      flush();
      continue;
    }
    run += (run.empty() ? "" : " ") + point(i);
  }
  flush();
  if (plot.marker && frame.drawn(*plot.marker)) {
    const size_t i = *plot.marker;
    svg << "<circle cx=\"" << format("%.2f", frame.px(i)) << "\" cy=\"" << format("%.2f", frame.py(i))
        << "\" r=\"5\" fill=\"red\"/>\n";
  }
  svg << "</svg>\n";

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  KILN_CHECK(out.good(), "write_svg_line_plot: cannot open '", path, "' for writing");
  out << svg.str();
  out.close();
  KILN_CHECK(out.good(), "write_svg_line_plot: writing '", path, "' failed");
}

namespace {

// matplotlib's default colour cycle ("tab10").
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr double kPanelHeight = 300, kPanelLeft = 80, kPanelRight = 600, kPanelTop = 36, kPanelBottom = 250;

// One panel with its top edge at `top`.
void draw_panel(std::ostringstream& svg, const PlotPanel& panel, double top) {
  auto plottable = [&](double x, double y) { return std::isfinite(x) && std::isfinite(y) && (!panel.log_y || y > 0); };
  auto axis_y = [&](double y) { return panel.log_y ? std::log10(y) : y; };
  std::vector<double> xs, ys;
  for (const PlotSeries& series : panel.series) {
    KILN_CHECK(series.x.size() == series.y.size(), "write_svg_panels: series '", series.name, "' of panel '",
               panel.title, "' has ", series.x.size(), " x values but ", series.y.size(), " y values");
    for (size_t i = 0; i < series.x.size(); ++i) {
      if (!plottable(series.x[i], series.y[i])) continue;
      xs.push_back(series.x[i]);
      ys.push_back(axis_y(series.y[i]));
    }
  }
  const double y0 = top + kPanelTop, y1 = top + kPanelBottom;
  svg << "<text x=\"" << (kPanelLeft + kPanelRight) / 2 << "\" y=\"" << top + 22
      << "\" text-anchor=\"middle\" font-size=\"14\">" << escape_xml(panel.title) << "</text>\n"
      << "<rect x=\"" << kPanelLeft << "\" y=\"" << y0 << "\" width=\"" << kPanelRight - kPanelLeft
      << "\" height=\"" << y1 - y0 << "\" fill=\"none\" stroke=\"black\"/>\n"
      << "<text x=\"" << (kPanelLeft + kPanelRight) / 2 << "\" y=\"" << y1 + 34 << "\" text-anchor=\"middle\">"
      << escape_xml(panel.x_label) << "</text>\n"
      << "<text x=\"20\" y=\"" << (y0 + y1) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
      << (y0 + y1) / 2 << ")\">" << escape_xml(panel.y_label) << "</text>\n";
  if (xs.empty()) {
    svg << "<text x=\"" << (kPanelLeft + kPanelRight) / 2 << "\" y=\"" << (y0 + y1) / 2
        << "\" text-anchor=\"middle\" fill=\"#7f7f7f\">no data</text>\n";
    return;
  }
  const Range x_range = padded_range(xs), y_range = padded_range(ys);
  auto to_px = [&](double x) { return kPanelLeft + (x - x_range.lo) / (x_range.hi - x_range.lo) * (kPanelRight - kPanelLeft); };
  auto to_py = [&](double y) { return y1 - (y - y_range.lo) / (y_range.hi - y_range.lo) * (y1 - y0); };
  const std::vector<double> y_ticks = axis_ticks(y_range, panel.log_y);
  svg << "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double tick : linear_ticks(x_range)) {
    svg << "<line x1=\"" << format("%.2f", to_px(tick)) << "\" y1=\"" << y0 << "\" x2=\"" << format("%.2f", to_px(tick))
        << "\" y2=\"" << y1 << "\"/>\n";
  }
  for (double tick : y_ticks) {
    svg << "<line x1=\"" << kPanelLeft << "\" y1=\"" << format("%.2f", to_py(tick)) << "\" x2=\"" << kPanelRight
        << "\" y2=\"" << format("%.2f", to_py(tick)) << "\"/>\n";
  }
  svg << "</g>\n<g text-anchor=\"middle\">\n";
  for (double tick : linear_ticks(x_range)) {
    svg << "<text x=\"" << format("%.2f", to_px(tick)) << "\" y=\"" << y1 + 16 << "\">" << format("%g", tick)
        << "</text>\n";
  }
  svg << "</g>\n<g text-anchor=\"end\">\n";
  for (double tick : y_ticks) {
    const std::string label = panel.log_y ? format("1e%.0f", tick) : format("%g", tick);
    svg << "<text x=\"" << kPanelLeft - 6 << "\" y=\"" << format("%.2f", to_py(tick) + 4) << "\">" << label
        << "</text>\n";
  }
  svg << "</g>\n";
  for (size_t k = 0; k < panel.series.size(); ++k) {
    const PlotSeries& series = panel.series[k];
    const char* color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string run;
    size_t points = 0;
    auto flush = [&] {
      // A lone point (one validation so far) is a dot, as matplotlib's marker.
      if (points == 1) {
        const size_t comma = run.find(',');
        svg << "<circle cx=\"" << run.substr(0, comma) << "\" cy=\"" << run.substr(comma + 1) << "\" r=\"3\" fill=\""
            << color << "\" data-series=\"" << escape_xml(series.name) << "\"/>\n";
      } else if (points > 1) {
        svg << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" data-series=\""
            << escape_xml(series.name) << "\" points=\"" << run << "\"/>\n";
      }
      run.clear();
      points = 0;
    };
    for (size_t i = 0; i < series.x.size(); ++i) {
      if (!plottable(series.x[i], series.y[i])) {
        flush();
        continue;
      }
      run += (run.empty() ? "" : " ") + format("%.2f", to_px(series.x[i])) + "," +
             format("%.2f", to_py(axis_y(series.y[i])));
      ++points;
    }
    flush();
    // The legend, top right inside the panel.
    const double legend_y = y0 + 16 + 16 * static_cast<double>(k);
    svg << "<line x1=\"" << kPanelRight - 150 << "\" y1=\"" << legend_y - 4 << "\" x2=\"" << kPanelRight - 130
        << "\" y2=\"" << legend_y - 4 << "\" stroke=\"" << color << "\" stroke-width=\"2\"/>\n"
        << "<text x=\"" << kPanelRight - 124 << "\" y=\"" << legend_y << "\">" << escape_xml(series.name)
        << "</text>\n";
  }
}

}  // namespace

void write_svg_panels(const std::string& path, const std::vector<PlotPanel>& panels) {
  const double height = kPanelHeight * static_cast<double>(std::max<size_t>(panels.size(), 1));
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << kWidth << " " << height << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < panels.size(); ++i) draw_panel(svg, panels[i], kPanelHeight * static_cast<double>(i));
  svg << "</svg>\n";
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), "write_svg_panels: cannot open '", temporary, "' for writing");
    out << svg.str();
    out.close();
    KILN_CHECK(out.good(), "write_svg_panels: writing '", temporary, "' failed");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  KILN_CHECK(!error, "write_svg_panels: cannot rename '", temporary, "' to '", path, "': ", error.message());
}

}  // namespace kiln
