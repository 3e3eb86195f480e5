// Pixels are set directly: lines by stepping along their longer axis (two
// pixels wide, no anti-aliasing), the marker as a filled disc, and text from a
// bitmap font; enough for a curve whose shape and scale are what matter.
#include "trainer/plot_raster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "kernels/error.h"

namespace kiln {

namespace {

constexpr int64_t kWidth = 640, kHeight = 480;
constexpr double kLeft = 80, kRight = 620, kTop = 40, kBottom = 420;  // the plot area, as the SVG's
constexpr int kFontScale = 2;                                          // 3x5 glyphs drawn 6x10

struct Colour {
  uint8_t r, g, b;
};
constexpr Colour kBlack{0, 0, 0}, kGrid{221, 221, 221}, kCurve{31, 119, 180}, kMarker{255, 0, 0};

// 3x5 glyphs: five rows of three bits, the top row in the highest bits.
uint16_t glyph(char c) {
  switch (c) {
    case '0': return 0b111'101'101'101'111;
    case '1': return 0b010'110'010'010'111;
    case '2': return 0b111'001'111'100'111;
    case '3': return 0b111'001'111'001'111;
    case '4': return 0b101'101'111'001'001;
    case '5': return 0b111'100'111'001'111;
    case '6': return 0b111'100'111'101'111;
    case '7': return 0b111'001'001'001'001;
    case '8': return 0b111'101'111'101'111;
    case '9': return 0b111'101'111'001'111;
    case '.': return 0b000'000'000'000'010;
    case '-': return 0b000'000'111'000'000;
    case '+': return 0b000'010'111'010'000;
    case 'e': return 0b010'101'111'100'011;
    default: return 0;  // drawn as a space
  }
}

class Canvas {
 public:
  Canvas() {
    image_.width = kWidth;
    image_.height = kHeight;
    image_.pixels.assign(static_cast<size_t>(kWidth * kHeight * 3), 255);  // white
  }

  void set(int64_t x, int64_t y, Colour colour) {
    if (x < 0 || y < 0 || x >= kWidth || y >= kHeight) return;
    uint8_t* pixel = image_.pixels.data() + (y * kWidth + x) * 3;
    pixel[0] = colour.r;
    pixel[1] = colour.g;
    pixel[2] = colour.b;
  }

  void line(double x0, double y0, double x1, double y1, Colour colour, int thickness = 1) {
    const auto steps = static_cast<int64_t>(std::ceil(std::max(std::abs(x1 - x0), std::abs(y1 - y0)))) + 1;
    for (int64_t i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(steps);
      const auto x = static_cast<int64_t>(std::lround(x0 + t * (x1 - x0)));
      const auto y = static_cast<int64_t>(std::lround(y0 + t * (y1 - y0)));
      for (int dy = 0; dy < thickness; ++dy) {
        for (int dx = 0; dx < thickness; ++dx) set(x + dx, y + dy, colour);
      }
    }
  }

  void disc(double cx, double cy, double radius, Colour colour) {
    for (auto y = static_cast<int64_t>(cy - radius); y <= static_cast<int64_t>(cy + radius) + 1; ++y) {
      for (auto x = static_cast<int64_t>(cx - radius); x <= static_cast<int64_t>(cx + radius) + 1; ++x) {
        if (std::hypot(static_cast<double>(x) - cx, static_cast<double>(y) - cy) <= radius) set(x, y, colour);
      }
    }
  }

  // `text` with its top-left corner at (x, y).
  void text(const std::string& text, double x, double y) {
    const auto left = static_cast<int64_t>(x), top = static_cast<int64_t>(y);
    for (size_t i = 0; i < text.size(); ++i) {
      const uint16_t bits = glyph(text[i]);
      for (int row = 0; row < 5; ++row) {
        for (int column = 0; column < 3; ++column) {
          if (((bits >> ((4 - row) * 3 + (2 - column))) & 1) == 0) continue;
          for (int s = 0; s < kFontScale * kFontScale; ++s) {
            set(left + static_cast<int64_t>(i) * text_advance() + column * kFontScale + s % kFontScale,
                top + row * kFontScale + s / kFontScale, kBlack);
          }
        }
      }
    }
  }
  static int64_t text_advance() { return 4 * kFontScale; }  // a glyph and one column of space
  static int64_t text_width(const std::string& text) { return static_cast<int64_t>(text.size()) * text_advance(); }

  RgbImage take() { return std::move(image_); }

 private:
  RgbImage image_;
};

struct Range {
  double lo = 0, hi = 1;
};

// The data's range with matplotlib's 5% margins; a single value gets a unit-wide range.
Range padded_range(const std::vector<double>& values) {
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  if (*hi - *lo <= 0) {
    const double half = std::max(std::abs(*lo) * 0.05, 0.5);
    return {*lo - half, *hi + half};
  }
  const double pad = (*hi - *lo) * 0.05;
  return {*lo - pad, *hi + pad};
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

std::string format(const char* pattern, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

}  // namespace

RgbImage rasterize_line_plot(const LinePlot& plot) {
  KILN_CHECK(plot.x.size() == plot.y.size(), "rasterize_line_plot: ", plot.x.size(), " x values but ",
             plot.y.size(), " y values");
  KILN_CHECK(!plot.marker || *plot.marker < plot.x.size(), "rasterize_line_plot: marker index ",
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
  const Range x_range = xs.empty() ? Range{} : padded_range(xs);
  const Range y_range = ys.empty() ? Range{} : padded_range(ys);
  auto to_px = [&](double axis_value) {
    return kLeft + (axis_value - x_range.lo) / (x_range.hi - x_range.lo) * (kRight - kLeft);
  };
  auto to_py = [&](double y) { return kBottom - (y - y_range.lo) / (y_range.hi - y_range.lo) * (kBottom - kTop); };

  Canvas canvas;
  // Ticks: decades on a log axis (1e-8, 1e-7, ...), else 1/2/5 steps.
  std::vector<double> x_ticks;
  if (plot.log_x) {
    for (double decade = std::ceil(x_range.lo); decade <= std::floor(x_range.hi); decade += 1) {
      x_ticks.push_back(decade);
    }
  }
  if (x_ticks.empty()) x_ticks = linear_ticks(x_range);
  for (double tick : x_ticks) {
    canvas.line(to_px(tick), kTop, to_px(tick), kBottom, kGrid);
    const std::string label = plot.log_x ? format("1e%.0f", tick) : format("%g", tick);
    canvas.text(label, to_px(tick) - static_cast<double>(Canvas::text_width(label)) / 2, kBottom + 8);
  }
  for (double tick : linear_ticks(y_range)) {
    canvas.line(kLeft, to_py(tick), kRight, to_py(tick), kGrid);
    const std::string label = format("%.4g", tick);
    canvas.text(label, kLeft - 6 - static_cast<double>(Canvas::text_width(label)), to_py(tick) - 5);
  }
  canvas.line(kLeft, kTop, kRight, kTop, kBlack);
  canvas.line(kLeft, kBottom, kRight, kBottom, kBlack);
  canvas.line(kLeft, kTop, kLeft, kBottom, kBlack);
  canvas.line(kRight, kTop, kRight, kBottom, kBlack);
  // The curve: consecutive plottable points joined; a point that is not plottable breaks it.
  for (size_t i = 1; i < plot.x.size(); ++i) {
    if (!plottable(i - 1) || !plottable(i)) continue;
    canvas.line(to_px(axis_x(plot.x[i - 1])), to_py(plot.y[i - 1]), to_px(axis_x(plot.x[i])), to_py(plot.y[i]),
                kCurve, 2);
  }
  if (plot.marker && plottable(*plot.marker)) {
    canvas.disc(to_px(axis_x(plot.x[*plot.marker])), to_py(plot.y[*plot.marker]), 5, kMarker);
  }
  return canvas.take();
}

}  // namespace kiln
