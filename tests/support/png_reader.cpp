#include "tests/support/png_reader.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace kiln::testing {

namespace {

uint32_t read_u32(const std::vector<uint8_t>& bytes, size_t at) {
  if (at + 4 > bytes.size()) throw std::runtime_error("PNG truncated at byte " + std::to_string(at));
  return (uint32_t{bytes[at]} << 24) | (uint32_t{bytes[at + 1]} << 16) | (uint32_t{bytes[at + 2]} << 8) |
         uint32_t{bytes[at + 3]};
}

}  // namespace

PngImage parse_png(const std::vector<uint8_t>& bytes) {
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() < 8 || !std::equal(signature, signature + 8, bytes.begin())) {
    throw std::runtime_error("not a PNG: the 8-byte signature is wrong");
  }
  PngImage image;
  std::vector<uint8_t> compressed;
  size_t at = 8;
  bool ended = false;
  while (at < bytes.size()) {
    if (ended) throw std::runtime_error("bytes after IEND");
    const uint32_t length = read_u32(bytes, at);
    if (at + 12 + static_cast<size_t>(length) > bytes.size()) {
      throw std::runtime_error("chunk at byte " + std::to_string(at) + " runs past the end of the file");
    }
    const std::string type(bytes.begin() + static_cast<std::ptrdiff_t>(at + 4),
                           bytes.begin() + static_cast<std::ptrdiff_t>(at + 8));
    const uint8_t* data = bytes.data() + at + 8;
    const uint32_t stored_crc = read_u32(bytes, at + 8 + length);
    const uint32_t crc = static_cast<uint32_t>(::crc32(0L, bytes.data() + at + 4, static_cast<uInt>(length + 4)));
    if (crc != stored_crc) throw std::runtime_error("CRC mismatch in chunk " + type);
    if (image.chunk_types.empty() && type != "IHDR") throw std::runtime_error("the first chunk is " + type);
    image.chunk_types.push_back(type);
    if (type == "IHDR") {
      if (length != 13) throw std::runtime_error("IHDR has " + std::to_string(length) + " bytes, not 13");
      const std::vector<uint8_t> header(data, data + 13);
      image.width = read_u32(header, 0);
      image.height = read_u32(header, 4);
      image.bit_depth = header[8];
      image.color_type = header[9];
      image.compression = header[10];
      image.filter = header[11];
      image.interlace = header[12];
    } else if (type == "IDAT") {
      compressed.insert(compressed.end(), data, data + length);
    } else if (type == "IEND") {
      if (length != 0) throw std::runtime_error("IEND is not empty");
      ended = true;
    }
    at += 12 + static_cast<size_t>(length);
  }
  if (!ended) throw std::runtime_error("no IEND chunk");
  if (image.bit_depth != 8 || image.color_type != 0 || image.compression != 0 || image.filter != 0 ||
      image.interlace != 0) {
    throw std::runtime_error("not an 8-bit, non-interlaced grayscale PNG");
  }
  if (image.width < 1 || image.height < 1) throw std::runtime_error("zero image size in IHDR");

  const size_t row_bytes = static_cast<size_t>(image.width) + 1;
  std::vector<uint8_t> rows(row_bytes * static_cast<size_t>(image.height) + 1);  // +1: detect extra data
  uLongf inflated = static_cast<uLongf>(rows.size());
  const int status = ::uncompress(rows.data(), &inflated, compressed.data(), static_cast<uLong>(compressed.size()));
  if (status != Z_OK) throw std::runtime_error("IDAT does not inflate: zlib status " + std::to_string(status));
  if (inflated != rows.size() - 1) {
    throw std::runtime_error("IDAT inflates to " + std::to_string(inflated) + " bytes, expected " +
                             std::to_string(rows.size() - 1));
  }
  image.pixels.reserve(static_cast<size_t>(image.width * image.height));
  for (int64_t y = 0; y < image.height; ++y) {
    const uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    if (row[0] != 0) throw std::runtime_error("row " + std::to_string(y) + " uses filter " + std::to_string(row[0]));
    image.pixels.insert(image.pixels.end(), row + 1, row + row_bytes);
  }
  return image;
}

PngImage read_png(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw std::runtime_error("cannot open '" + path + "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  return parse_png(bytes);
}

}  // namespace kiln::testing
