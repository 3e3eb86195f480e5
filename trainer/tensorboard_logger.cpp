// Event files by hand: TensorBoard's formats are small enough that a protobuf
// dependency would cost more than the ~60 lines of encoding below. Field
// numbers are those of tensorflow/core/util/event.proto, summary.proto,
// histogram.proto and tensorboard/plugins/hparams/plugin_data.proto.
#include "trainer/tensorboard_logger.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>

#include "data/png_encode.h"
#include "kernels/error.h"
#include "trainer/trainer.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------- TFRecord framing

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses.
uint32_t crc32c(const char* data, size_t size) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> entries{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
      entries[i] = crc;
    }
    return entries;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// TFRecord stores CRCs masked, so that a CRC of data that itself holds CRCs
// is not degenerate.
uint32_t masked_crc32c(const char* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// length (uint64), masked CRC of the length, data, masked CRC of the data.
std::string tfrecord(const std::string& data) {
  std::string record;
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

// ---------------------------------------------------------------- protobuf encoding

enum WireType : uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, fixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, fixed32);
  put_le(out, bits, 4);
}

void put_int(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, varint);
  put_varint(out, static_cast<uint64_t>(value));  // int64: two's complement, 10 bytes when negative
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, length_delimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// A packed repeated double: one length-delimited field of 8-byte values.
void put_doubles(std::string& out, uint32_t field, const std::vector<double>& values) {
  put_key(out, field, length_delimited);
  put_varint(out, values.size() * 8);
  for (double value : values) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    put_le(out, bits, 8);
  }
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { wall_time = 1; step = 2; file_version = 3 | summary = 5 }.
std::string event(int64_t step, uint32_t payload_field, const std::string& payload) {
  std::string message;
  put_double(message, 1, wall_time_now());
  if (step != 0) put_int(message, 2, step);  // proto3: a default value is not written
  put_bytes(message, payload_field, payload);
  return message;
}

// Summary.Value { tag = 1; simple_value = 2 }.
std::string scalar_value(const std::string& tag, double value) {
  std::string message;
  put_bytes(message, 1, tag);
  put_float(message, 2, static_cast<float>(value));
  return message;
}

// google.protobuf.Value { number_value = 2 | string_value = 3 | bool_value = 4 }.
std::string hparam_value(const std::string& text) {
  std::string message;
  if (text == "true" || text == "false") {
    put_int(message, 4, text == "true" ? 1 : 0);
    return message;
  }
  char* end = nullptr;
  const double number = std::strtod(text.c_str(), &end);
  if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(number)) {
    put_double(message, 2, number);
  } else {
    put_bytes(message, 3, text);
  }
  return message;
}

// The hparams plugin's session_start_info: a Summary.Value { tag = 1,
// metadata = 9 } whose SummaryMetadata { plugin_data = 1 { plugin_name = 1,
// content = 2 } } content is HParamsPluginData { version = 1 (0),
// session_start_info = 3 { hparams = 1 (map<string, Value>), start_time_secs = 5 } }.
std::string hparams_value(const std::map<std::string, std::string>& hparams) {
  std::string session_start_info;
  for (const auto& [key, text] : hparams) {
    std::string entry;  // a map entry: key = 1, value = 2
    put_bytes(entry, 1, key);
    put_bytes(entry, 2, hparam_value(text));
    put_bytes(session_start_info, 1, entry);
  }
  put_double(session_start_info, 5, wall_time_now());
  std::string plugin_content;
  put_bytes(plugin_content, 3, session_start_info);  // version 0 is the default: not written
  std::string plugin_data;
  put_bytes(plugin_data, 1, "hparams");
  put_bytes(plugin_data, 2, plugin_content);
  std::string metadata;
  put_bytes(metadata, 1, plugin_data);
  std::string value;
  put_bytes(value, 1, "_hparams_/session_start_info");
  put_bytes(value, 9, metadata);
  return value;
}

// Summary.Value { tag = 1; image = 4 } holding Summary.Image { height = 1;
// width = 2; colorspace = 3 (1 grayscale, 3 RGB); encoded_image_string = 4 }.
std::string image_value(const std::string& tag, int64_t width, int64_t height, int channels,
                        const std::string& png) {
  std::string image;
  put_int(image, 1, height);
  put_int(image, 2, width);
  put_int(image, 3, channels);
  put_bytes(image, 4, png);
  std::string value;
  put_bytes(value, 1, tag);
  put_bytes(value, 4, image);
  return value;
}

// TensorFlow's default histogram bucket limits (tsl/lib/histogram): 1e-12
// growing by 10% up to 1e20, mirrored below zero, with 0 between and DBL_MAX
// last, so that buckets are fine near zero and every double has one.
const std::vector<double>& default_bucket_limits() {
  static const std::vector<double> limits = [] {
    std::vector<double> positive;
    for (double limit = 1e-12; limit < 1e20; limit *= 1.1) positive.push_back(limit);
    std::vector<double> all;
    for (auto limit = positive.rbegin(); limit != positive.rend(); ++limit) all.push_back(-*limit);
    all.push_back(0.0);
    all.insert(all.end(), positive.begin(), positive.end());
    all.push_back(std::numeric_limits<double>::max());
    return all;
  }();
  return limits;
}

// Summary.Value { tag = 1; histo = 5 } holding HistogramProto { min = 1;
// max = 2; num = 3; sum = 4; sum_squares = 5; bucket_limit = 6; bucket = 7 },
// where bucket i counts the values in [bucket_limit[i - 1], bucket_limit[i]).
std::string histogram_value(const std::string& tag, const std::vector<double>& values) {
  const std::vector<double>& limits = default_bucket_limits();
  std::vector<double> counts(limits.size(), 0.0);
  double low = values.front(), high = values.front(), sum = 0, sum_squares = 0;
  for (double value : values) {
    low = std::min(low, value);
    high = std::max(high, value);
    sum += value;
    sum_squares += value * value;
    // The first limit above the value; DBL_MAX itself goes in the last bucket.
    const auto bucket = static_cast<size_t>(std::upper_bound(limits.begin(), limits.end(), value) - limits.begin());
    counts[std::min(bucket, limits.size() - 1)] += 1;
  }
  // ~1,550 buckets of which a tensor fills a few: each run of empty buckets is
  // written as one, ending at the run's last limit (TensorFlow's writer does so).
  std::vector<double> kept_limits, kept_counts;
  for (size_t i = 0; i < limits.size();) {
    double limit = limits[i];
    const double count = counts[i++];
    while (count == 0 && i < limits.size() && counts[i] == 0) limit = limits[i++];
    kept_limits.push_back(limit);
    kept_counts.push_back(count);
  }
  std::string histogram;
  put_double(histogram, 1, low);
  put_double(histogram, 2, high);
  put_double(histogram, 3, static_cast<double>(values.size()));
  put_double(histogram, 4, sum);
  put_double(histogram, 5, sum_squares);
  put_doubles(histogram, 6, kept_limits);
  put_doubles(histogram, 7, kept_counts);
  std::string value;
  put_bytes(value, 1, tag);
  put_bytes(value, 5, histogram);
  return value;
}

std::atomic<int> next_writer_uid{0};

}  // namespace

TensorBoardLogger::TensorBoardLogger(const std::string& root_dir, const std::string& name, std::optional<int> version,
                                     double flush_secs)
    : root_dir_(root_dir), name_(name), requested_version_(version), flush_secs_(flush_secs) {
  KILN_CHECK(!version || *version >= 0, "TensorBoardLogger: version must be >= 0, got ", version.value_or(0));
}

void TensorBoardLogger::open() const {
  if (file_ != nullptr) return;
  const fs::path base = fs::path(root_dir_) / name_;
  if (requested_version_) {
    version_ = *requested_version_;
  } else {
    while (fs::exists(base / ("version_" + std::to_string(version_)))) ++version_;
  }
  const fs::path folder = base / ("version_" + std::to_string(version_));
  std::error_code error;
  fs::create_directories(folder, error);
  KILN_CHECK(!error, "TensorBoardLogger: cannot create '", folder.string(), "': ", error.message());
  log_dir_ = folder.string();

  // TensorBoard's EventFileWriter names: time (10 digits), host, pid, writer number.
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  char file_name[512];
  std::snprintf(file_name, sizeof file_name, "events.out.tfevents.%010lld.%s.%d.%d",
                static_cast<long long>(std::time(nullptr)), host, static_cast<int>(::getpid()),
                next_writer_uid.fetch_add(1));
  const std::string path = (folder / file_name).string();
  std::FILE* file = std::fopen(path.c_str(), "ab");
  KILN_CHECK(file != nullptr, "TensorBoardLogger: cannot open '", path, "' for writing: ", std::strerror(errno));
  event_file_ = path;
  file_ = file;
  std::string first;
  put_double(first, 1, wall_time_now());
  put_bytes(first, 3, "brain.Event:2");
  // The header record, written and flushed here: write_event and flush are not const.
  const std::string record = tfrecord(first);
  KILN_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size() && std::fflush(file_) == 0,
             "TensorBoardLogger: cannot write to '", event_file_, "': ", std::strerror(errno));
  last_flush_ = std::chrono::steady_clock::now();  // TensorBoard finds the run as soon as the file has its header
}

const std::string& TensorBoardLogger::log_dir() const {
  open();
  return log_dir_;
}

int TensorBoardLogger::version() const {
  open();
  return version_;
}

const std::string& TensorBoardLogger::event_file() const {
  open();
  return event_file_;
}

TensorBoardLogger::~TensorBoardLogger() {
  if (file_ != nullptr) {
    std::fflush(file_);
    std::fclose(file_);
  }
}

void TensorBoardLogger::write_event(const std::string& event) {
  open();
  const std::string record = tfrecord(event);
  const size_t written = std::fwrite(record.data(), 1, record.size(), file_);
  KILN_CHECK(written == record.size(), "TensorBoardLogger: cannot write to '", event_file_, "': ",
             std::strerror(errno));
}

void TensorBoardLogger::flush(bool sync) {
  open();
  KILN_CHECK(std::fflush(file_) == 0, "TensorBoardLogger: cannot flush '", event_file_, "': ", std::strerror(errno));
  if (sync) {
    KILN_CHECK(::fsync(::fileno(file_)) == 0, "TensorBoardLogger: cannot fsync '", event_file_,
               "': ", std::strerror(errno));
  }
  last_flush_ = std::chrono::steady_clock::now();
}

void TensorBoardLogger::write_summary(int64_t step, const std::string& summary) {
  write_event(event(step, 5, summary));
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count() >= flush_secs_) {
    flush(false);
  }
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) {
  std::string summary;  // Summary { repeated Value value = 1 }
  for (const auto& [tag, value] : metrics) put_bytes(summary, 1, scalar_value(tag, value));
  if (metrics.find("epoch") == metrics.end()) put_bytes(summary, 1, scalar_value("epoch", static_cast<double>(epoch)));
  write_summary(step, summary);
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& hparams) {
  const fs::path path = fs::path(log_dir()) / "hparams.yaml";
  {
    std::ofstream out(path);
    KILN_CHECK(out.is_open(), "TensorBoardLogger: cannot write '", path.string(), "'");
    if (hparams.empty()) out << "{}\n";
    for (const auto& [key, value] : hparams) out << key << ": " << value << "\n";
  }
  std::string summary;
  put_bytes(summary, 1, hparams_value(hparams));
  write_event(event(0, 5, summary));
}

void TensorBoardLogger::save() { flush(true); }

void TensorBoardLogger::log_image(const std::string& tag, int64_t width, int64_t height, int channels,
                                  const uint8_t* pixels, int64_t step) {
  KILN_CHECK(!tag.empty(), "TensorBoardLogger::log_image: the tag is empty");
  KILN_CHECK(width >= 1 && height >= 1, "TensorBoardLogger::log_image('", tag, "'): the image is ", width, "x",
             height, "; each side must be at least 1");
  KILN_CHECK(channels == 1 || channels == 3, "TensorBoardLogger::log_image('", tag,
             "'): expected 1 (grayscale) or 3 (RGB) channels, got ", channels);
  KILN_CHECK(pixels != nullptr, "TensorBoardLogger::log_image('", tag, "'): the pixels are null");
  std::string summary;
  put_bytes(summary, 1, image_value(tag, width, height, channels, encode_png(pixels, width, height, channels)));
  write_summary(step, summary);
}

void TensorBoardLogger::log_image(const std::string& tag, const Tensor& image, int64_t step,
                                  const std::string& dataformats) {
  const std::string where = "TensorBoardLogger::log_image('" + tag + "')";
  KILN_CHECK(image.defined(), where, ": the image tensor is undefined");
  KILN_CHECK(dataformats == "CHW" || dataformats == "HWC" || dataformats == "HW", where,
             ": dataformats must be \"CHW\", \"HWC\" or \"HW\", got '", dataformats, "'");
  KILN_CHECK(image.dim() == static_cast<int64_t>(dataformats.size()), where, ": dataformats ", dataformats,
             " needs a ", dataformats.size(), "-d tensor, got shape ", shape_str(image.shape()));
  KILN_CHECK(is_floating(image.dtype()) || image.dtype() == DType::u8, where,
             ": expected a floating image (values in [0, 1]) or uint8, got ", dtype_name(image.dtype()));
  KILN_CHECK(image.numel() > 0, where, ": the image of shape ", shape_str(image.shape()), " is empty");
  const auto axis = [&](char name) { return static_cast<int64_t>(dataformats.find(name)); };
  const int64_t channels = dataformats == "HW" ? 1 : image.size(axis('C'));
  KILN_CHECK(channels == 1 || channels == 3, where, ": expected 1 (grayscale) or 3 (RGB) channels, got ", channels,
             " in shape ", shape_str(image.shape()), " (", dataformats, ")");
  const int64_t height = image.size(axis('H')), width = image.size(axis('W'));
  const Tensor hwc = dataformats == "CHW" ? image.detach().permute({1, 2, 0}) : image.detach();  // (H, W[, C])
  std::vector<uint8_t> pixels;
  if (image.dtype() == DType::u8) {
    pixels = hwc.to(Device::cpu()).contiguous().to_vector<uint8_t>();
  } else {
    const std::vector<float> values = hwc.to(Device::cpu(), DType::f32).contiguous().to_vector<float>();
    pixels.resize(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      // torch's add_image: (x * 255).clip(0, 255).astype(uint8), which truncates.
      const float scaled = std::clamp(values[i] * 255.0f, 0.0f, 255.0f);
      pixels[i] = std::isnan(scaled) ? 0 : static_cast<uint8_t>(scaled);
    }
  }
  log_image(tag, width, height, static_cast<int>(channels), pixels.data(), step);
}

void TensorBoardLogger::log_histogram(const std::string& tag, const Tensor& values, int64_t step) {
  KILN_CHECK(values.defined(), "TensorBoardLogger::log_histogram('", tag, "'): the tensor is undefined");
  KILN_CHECK(values.dtype() != DType::b8, "TensorBoardLogger::log_histogram('", tag,
             "'): expected a numeric tensor, got bool");
  KILN_CHECK(values.numel() > 0, "TensorBoardLogger::log_histogram('", tag, "'): the tensor of shape ",
             shape_str(values.shape()), " is empty");
  // To the host first: a float64 copy made on the device would double (bfloat16: quadruple) the memory.
  log_histogram(tag, values.detach().cpu().to(DType::f64).contiguous().to_vector<double>(), step);
}

void TensorBoardLogger::log_histogram(const std::string& tag, const std::vector<double>& values, int64_t step) {
  KILN_CHECK(!tag.empty(), "TensorBoardLogger::log_histogram: the tag is empty");
  KILN_CHECK(!values.empty(), "TensorBoardLogger::log_histogram('", tag, "'): no values");
  const auto non_finite = std::count_if(values.begin(), values.end(), [](double v) { return !std::isfinite(v); });
  KILN_CHECK(non_finite == 0, "TensorBoardLogger::log_histogram('", tag, "'): ", non_finite, " of the ",
             values.size(), " values are NaN or infinite; a histogram needs finite values");
  std::string summary;
  put_bytes(summary, 1, histogram_value(tag, values));
  write_summary(step, summary);
}

TensorBoardLogger* find_tensorboard_logger(const Trainer& trainer) {
  const TrainerOptions& options = trainer.options();
  // The Trainer writes to its loggers only on rank 0, and not at all under fast_dev_run.
  if (!trainer.is_global_zero() || !options.logger || options.fast_dev_run > 0) return nullptr;
  for (const std::shared_ptr<Logger>& logger : options.loggers) {
    if (auto* tensorboard = dynamic_cast<TensorBoardLogger*>(logger.get())) return tensorboard;
  }
  return nullptr;
}

}  // namespace kiln
