// A strict reader of the PNG files kiln writes (8-bit grayscale), for tests:
// written from RFC 2083 independently of data/image_io.cpp, it checks the
// signature, every chunk's CRC-32, IHDR's fields, the chunk order and the zlib
// stream, so a test that reads an image back also checks the file format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::testing {

struct PngImage {
  int64_t width = 0, height = 0;
  int bit_depth = 0, color_type = 0, compression = 0, filter = 0, interlace = 0;
  std::vector<std::string> chunk_types;  // in file order
  std::vector<uint8_t> pixels;           // (height, width), row-major
};

// Parses `bytes`; throws std::runtime_error saying what is wrong (bad
// signature, CRC mismatch, missing chunk, truncated data, a filter type
// other than 0, ...). Accepts only 8-bit grayscale, non-interlaced images.
PngImage parse_png(const std::vector<uint8_t>& bytes);
// Reads the file and parses it (throws std::runtime_error when unreadable).
PngImage read_png(const std::string& path);

}  // namespace kiln::testing
