// PNG bytes in memory for 8-bit grayscale and RGB pixels, for places that
// embed an image rather than write a file (TensorBoard's image summaries).
// data/image_io.h writes PNG files with it.
#pragma once

#include <cstdint>
#include <string>

namespace kiln {

// `pixels` is (height, width, channels) row-major, 0 .. 255; channels 1
// (grayscale, PNG colour type 0) or 3 (RGB, colour type 2). Returns the PNG
// file's bytes. Throws kiln::Error for a side below 1 or above 2^31 - 1, null
// pixels or another channel count.
std::string encode_png(const uint8_t* pixels, int64_t width, int64_t height, int channels);

}  // namespace kiln
