// PNG layout (RFC 2083): the 8-byte signature, then chunks of [length (4,
// big-endian), type (4), data, CRC-32 of type + data]: IHDR (size, bit depth
// 8, colour type), one IDAT with the zlib stream of every row prefixed by its
// filter byte (0: none), and an empty IEND.
#include "data/png_encode.h"

#include <zlib.h>

#include <cstring>
#include <limits>
#include <vector>

#include "kernels/error.h"

namespace kiln {

namespace {

void append_u32(std::string& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((value >> shift) & 0xFF));
}

void append_chunk(std::string& out, const char (&type)[5], const std::string& data) {
  append_u32(out, static_cast<uint32_t>(data.size()));
  const size_t type_start = out.size();
  out.append(type, 4);
  out += data;
  // The CRC covers the type and the data, not the length.
  const uLong crc = ::crc32(0L, reinterpret_cast<const Bytef*>(out.data() + type_start),
                            static_cast<uInt>(out.size() - type_start));
  append_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

std::string encode_png(const uint8_t* pixels, int64_t width, int64_t height, int channels) {
  constexpr int64_t largest = std::numeric_limits<int32_t>::max();  // PNG sizes are 31-bit
  KILN_CHECK(width >= 1 && height >= 1 && width <= largest && height <= largest, "encode_png: image size ", width,
             "x", height, " is invalid (each side must be in [1, 2^31 - 1])");
  KILN_CHECK(channels == 1 || channels == 3, "encode_png: expected 1 (grayscale) or 3 (RGB) channels, got ",
             channels);
  KILN_CHECK(pixels != nullptr, "encode_png: the pixels of the ", width, "x", height, " image are null");

  std::string header;
  append_u32(header, static_cast<uint32_t>(width));
  append_u32(header, static_cast<uint32_t>(height));
  const char colour_type = channels == 1 ? 0 : 2;
  header += std::string{8, colour_type, 0, 0, 0};  // bit depth 8, deflate, filter set 0, no interlace

  const size_t pixel_row = static_cast<size_t>(width) * static_cast<size_t>(channels);
  const size_t row_bytes = pixel_row + 1;
  std::vector<uint8_t> rows(row_bytes * static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) {
    uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    row[0] = 0;  // filter: none
    std::memcpy(row + 1, pixels + static_cast<size_t>(y) * pixel_row, pixel_row);
  }
  uLongf compressed_size = ::compressBound(static_cast<uLong>(rows.size()));
  std::string compressed(compressed_size, '\0');
  const int status = ::compress2(reinterpret_cast<Bytef*>(compressed.data()), &compressed_size, rows.data(),
                                 static_cast<uLong>(rows.size()), Z_DEFAULT_COMPRESSION);
  KILN_CHECK(status == Z_OK, "encode_png: zlib compress2 failed with status ", status, " for a ", width, "x",
             height, " image");
  compressed.resize(compressed_size);

  std::string png = "\x89PNG\r\n\x1a\n";
  append_chunk(png, "IHDR", header);
  append_chunk(png, "IDAT", compressed);
  append_chunk(png, "IEND", "");
  return png;
}

}  // namespace kiln
