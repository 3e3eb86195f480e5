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
#include "trainer/plot_frame.h"

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


std::string format(const char* pattern, double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

}  // namespace

RgbImage rasterize_line_plot(const LinePlot& plot) {
  const plot::LinePlotFrame frame(plot, "rasterize_line_plot", kLeft, kRight, kTop, kBottom);
  auto to_px = [&](double axis_value) { return frame.axis_px(axis_value); };
  auto to_py = [&](double y) { return frame.value_py(y); };

  Canvas canvas;
  for (double tick : frame.x_ticks()) {
    canvas.line(to_px(tick), kTop, to_px(tick), kBottom, kGrid);
    const std::string label = plot.log_x ? format("1e%.0f", tick) : format("%g", tick);
    canvas.text(label, to_px(tick) - static_cast<double>(Canvas::text_width(label)) / 2, kBottom + 8);
  }
  for (double tick : frame.y_ticks()) {
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
    if (!frame.drawn(i - 1) || !frame.drawn(i)) continue;
    canvas.line(frame.px(i - 1), frame.py(i - 1), frame.px(i), frame.py(i), kCurve, 2);
  }
  if (plot.marker && frame.drawn(*plot.marker)) {
    canvas.disc(frame.px(*plot.marker), frame.py(*plot.marker), 5, kMarker);
  }
  return canvas.take();
}

}  // namespace kiln
