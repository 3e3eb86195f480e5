#include "tests/support/tensorboard_reader.h"

#include <doctest/doctest.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

namespace kiln::testing {

namespace {

uint64_t read_le(const std::string& bytes, size_t offset, int count) {
  uint64_t value = 0;
  for (int i = 0; i < count; ++i) value |= uint64_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  return value;
}

uint32_t read_be32(const std::string& bytes, size_t offset) {
  REQUIRE(offset + 4 <= bytes.size());
  uint32_t value = 0;
  for (size_t i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return value;
}

// A repeated double, packed (one length-delimited field) or one fixed64 per value.
void append_doubles(const Field& field, std::vector<double>& out) {
  if (field.wire_type == 1) {
    out.push_back(as_double(field.bits));
    return;
  }
  REQUIRE(field.wire_type == 2);
  REQUIRE(field.bytes.size() % 8 == 0);
  for (size_t at = 0; at < field.bytes.size(); at += 8) out.push_back(as_double(read_le(field.bytes, at, 8)));
}

ImageSummary parse_image(const std::string& tag, const std::string& message) {
  ImageSummary image{tag};
  for (const Field& field : parse_message(message)) {
    if (field.number == 1) image.height = static_cast<int64_t>(field.bits);
    if (field.number == 2) image.width = static_cast<int64_t>(field.bits);
    if (field.number == 3) image.colorspace = static_cast<int64_t>(field.bits);
    if (field.number == 4) image.encoded = field.bytes;
  }
  return image;
}

HistogramSummary parse_histogram(const std::string& tag, const std::string& message) {
  HistogramSummary histogram{tag};
  for (const Field& field : parse_message(message)) {
    switch (field.number) {
      case 1: histogram.min = as_double(field.bits); break;
      case 2: histogram.max = as_double(field.bits); break;
      case 3: histogram.num = as_double(field.bits); break;
      case 4: histogram.sum = as_double(field.bits); break;
      case 5: histogram.sum_squares = as_double(field.bits); break;
      case 6: append_doubles(field, histogram.bucket_limit); break;
      case 7: append_doubles(field, histogram.bucket); break;
      default: FAIL("unexpected HistogramProto field " << field.number);
    }
  }
  return histogram;
}

}  // namespace

uint32_t crc32c_bitwise(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::vector<std::string> read_records(const std::string& file, size_t* whole_bytes) {
  std::ifstream in(file, std::ios::binary);
  REQUIRE(in.is_open());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset + 12 <= bytes.size()) {
    const std::string length_bytes = bytes.substr(offset, 8);
    const uint64_t length = read_le(bytes, offset, 8);
    REQUIRE(read_le(bytes, offset + 8, 4) == masked_crc(crc32c_bitwise(length_bytes)));
    if (offset + 12 + length + 4 > bytes.size()) break;  // a truncated last record
    const std::string data = bytes.substr(offset + 12, length);
    REQUIRE(read_le(bytes, offset + 12 + length, 4) == masked_crc(crc32c_bitwise(data)));
    records.push_back(data);
    offset += 12 + length + 4;
  }
  if (whole_bytes != nullptr) *whole_bytes = offset;
  return records;
}

std::vector<Field> parse_message(const std::string& message) {
  std::vector<Field> fields;
  size_t offset = 0;
  auto varint = [&] {
    uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(offset < message.size());
      const auto byte = static_cast<unsigned char>(message[offset++]);
      value |= uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80) == 0) return value;
    }
  };
  while (offset < message.size()) {
    const uint64_t key = varint();
    Field field{static_cast<uint32_t>(key >> 3), static_cast<uint32_t>(key & 7)};
    switch (field.wire_type) {
      case 0: field.bits = varint(); break;
      case 1: REQUIRE(offset + 8 <= message.size()); field.bits = read_le(message, offset, 8), offset += 8; break;
      case 5: REQUIRE(offset + 4 <= message.size()); field.bits = read_le(message, offset, 4), offset += 4; break;
      case 2: {
        const uint64_t length = varint();
        REQUIRE(offset + length <= message.size());
        field.bytes = message.substr(offset, length);
        offset += length;
        break;
      }
      default: FAIL("unexpected protobuf wire type " << field.wire_type);
    }
    fields.push_back(field);
  }
  return fields;
}

double as_double(uint64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

float as_float(uint64_t bits) {
  const auto narrow = static_cast<uint32_t>(bits);
  float value;
  std::memcpy(&value, &narrow, sizeof value);
  return value;
}

Event parse_event(const std::string& record) {
  Event event;
  for (const Field& field : parse_message(record)) {
    if (field.number == 1) event.wall_time = as_double(field.bits);
    if (field.number == 2) event.step = static_cast<int64_t>(field.bits);
    if (field.number == 3) event.file_version = field.bytes;
    if (field.number != 5) continue;
    for (const Field& value : parse_message(field.bytes)) {
      REQUIRE(value.number == 1);
      std::string tag;
      std::optional<float> scalar;
      std::optional<std::string> image, histogram;
      for (const Field& part : parse_message(value.bytes)) {
        if (part.number == 1) tag = part.bytes;
        if (part.number == 2) scalar = as_float(part.bits);
        if (part.number == 4) image = part.bytes;
        if (part.number == 5) histogram = part.bytes;
      }
      if (scalar) {
        event.scalars[tag] = *scalar;
      } else if (image) {
        event.images.push_back(parse_image(tag, *image));
      } else if (histogram) {
        event.histograms.push_back(parse_histogram(tag, *histogram));
      } else {
        event.other_values.push_back(value.bytes);
      }
    }
  }
  return event;
}

std::vector<Event> read_events(const std::string& file) {
  std::vector<Event> events;
  for (const std::string& record : read_records(file)) events.push_back(parse_event(record));
  return events;
}

std::string only_event_file(const std::filesystem::path& folder) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(entry.path().string());
  }
  REQUIRE(files.size() == 1);
  return files.front();
}

DecodedPng decode_png(const std::string& bytes) {
  REQUIRE(bytes.size() > 8);
  REQUIRE(bytes.compare(0, 8, std::string("\x89PNG\r\n\x1a\n", 8)) == 0);
  DecodedPng png;
  std::string compressed;
  std::vector<std::string> types;
  for (size_t at = 8; at < bytes.size();) {
    const uint32_t length = read_be32(bytes, at);
    REQUIRE(at + 12 + length <= bytes.size());
    const std::string type_and_data = bytes.substr(at + 4, 4 + length);
    const auto crc = static_cast<uint32_t>(
        ::crc32(0L, reinterpret_cast<const Bytef*>(type_and_data.data()), static_cast<uInt>(type_and_data.size())));
    REQUIRE(read_be32(bytes, at + 8 + length) == crc);
    const std::string type = type_and_data.substr(0, 4), data = type_and_data.substr(4);
    types.push_back(type);
    if (type == "IHDR") {
      REQUIRE(data.size() == 13);
      png.width = read_be32(data, 0);
      png.height = read_be32(data, 4);
      png.bit_depth = static_cast<unsigned char>(data[8]);
      png.colour_type = static_cast<unsigned char>(data[9]);
      REQUIRE(data.substr(10) == std::string(3, '\0'));  // deflate, filter set 0, no interlace
    }
    if (type == "IDAT") compressed += data;
    at += 12 + length;
  }
  REQUIRE(types.size() >= 3);
  REQUIRE(types.front() == "IHDR");
  REQUIRE(types.back() == "IEND");
  REQUIRE(png.bit_depth == 8);
  REQUIRE((png.colour_type == 0 || png.colour_type == 2));
  const size_t channels = png.colour_type == 0 ? 1 : 3;
  const size_t row_bytes = 1 + static_cast<size_t>(png.width) * channels;
  std::vector<uint8_t> rows(row_bytes * static_cast<size_t>(png.height) + 1);  // one spare byte: a longer stream shows
  uLongf size = rows.size();
  REQUIRE(::uncompress(rows.data(), &size, reinterpret_cast<const Bytef*>(compressed.data()),
                       static_cast<uLong>(compressed.size())) == Z_OK);
  REQUIRE(size == row_bytes * static_cast<size_t>(png.height));
  for (int64_t y = 0; y < png.height; ++y) {
    const uint8_t* row = rows.data() + static_cast<size_t>(y) * row_bytes;
    REQUIRE(row[0] == 0);  // filter type none
    png.pixels.insert(png.pixels.end(), row + 1, row + row_bytes);
  }
  return png;
}

}  // namespace kiln::testing
