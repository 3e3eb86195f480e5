// A LinePlot (trainer/plot_svg.h) drawn into pixels, for places that take a
// raster image rather than SVG: TensorBoard's image summaries (the learning
// rate finder's curve). The same picture as write_svg_line_plot, less the
// words: white ground, grey grid lines at the ticks, tick labels in a 3x5
// pixel font drawn at twice its size (digits, '.', '-', '+', 'e'), a black
// frame, the curve in matplotlib's blue (a NaN or inf breaks it) and the
// marker as a red dot. TensorBoard shows the tag where the title would be.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/plot_svg.h"

namespace kiln {

struct RgbImage {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;  // (height, width, 3), row-major
};

// Draws `plot` on a 640x480 canvas. Throws kiln::Error when x and y differ
// in length or the marker is out of range.
RgbImage rasterize_line_plot(const LinePlot& plot);

}  // namespace kiln
