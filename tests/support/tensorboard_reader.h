// A reader of TensorBoard event files written from the format's specification
// (TFRecord framing with both CRCs, protobuf Event, Summary, Summary.Image and
// HistogramProto messages), sharing no code with trainer/tensorboard_logger.cpp,
// for tests/test_tensorboard_*.cpp. Failures are doctest REQUIREs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace kiln::testing {

// CRC-32C bit by bit (no table), and TFRecord's mask of it.
uint32_t crc32c_bitwise(const std::string& bytes);
uint32_t masked_crc(uint32_t crc);

// The records of a TFRecord file; every CRC is checked. `whole_bytes` is the
// length of the prefix made of whole records.
std::vector<std::string> read_records(const std::string& file, size_t* whole_bytes = nullptr);

// One protobuf field: its number, wire type, and either a varint/fixed value or bytes.
struct Field {
  uint32_t number = 0;
  uint32_t wire_type = 0;
  uint64_t bits = 0;
  std::string bytes;
};
std::vector<Field> parse_message(const std::string& message);
double as_double(uint64_t bits);
float as_float(uint64_t bits);

// Summary.Image: height = 1, width = 2, colorspace = 3, encoded_image_string = 4.
struct ImageSummary {
  std::string tag;
  int64_t height = 0, width = 0, colorspace = 0;
  std::string encoded;
};

// HistogramProto: min = 1 ... sum_squares = 5, bucket_limit = 6, bucket = 7 (packed or not).
struct HistogramSummary {
  std::string tag;
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit, bucket;
};

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;
  std::vector<ImageSummary> images;
  std::vector<HistogramSummary> histograms;
  std::vector<std::string> other_values;  // Summary.Values of other kinds (the hparams plugin's)
};
Event parse_event(const std::string& record);
// Every event of the file, the file_version header first.
std::vector<Event> read_events(const std::string& file);

// The one events.out.tfevents.* file in `folder` (REQUIREs that there is one).
std::string only_event_file(const std::filesystem::path& folder);

// A PNG's IHDR and its pixels, inflated and unfiltered (filter type 0 only, as kiln writes).
struct DecodedPng {
  int64_t width = 0, height = 0;
  int bit_depth = 0, colour_type = 0;
  std::vector<uint8_t> pixels;  // (height, width, channels)
};
// REQUIREs the signature, IHDR first, every chunk's CRC-32, IEND last, and
// height rows of 1 + width * channels bytes in the zlib stream.
DecodedPng decode_png(const std::string& bytes);

}  // namespace kiln::testing
