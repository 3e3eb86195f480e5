// Event files by hand: TensorBoard's formats are small enough that a protobuf
// dependency would cost more than the ~60 lines of encoding below. Field
// numbers are those of tensorflow/core/util/event.proto, summary.proto and
// tensorboard/plugins/hparams/plugin_data.proto.
#include "trainer/tensorboard_logger.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "kernels/error.h"

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

std::atomic<int> next_writer_uid{0};

}  // namespace

TensorBoardLogger::TensorBoardLogger(const std::string& root_dir, const std::string& name, std::optional<int> version,
                                     double flush_secs)
    : flush_secs_(flush_secs), last_flush_(std::chrono::steady_clock::now()) {
  const fs::path base = fs::path(root_dir) / name;
  if (version) {
    KILN_CHECK(*version >= 0, "TensorBoardLogger: version must be >= 0, got ", *version);
    version_ = *version;
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
  event_file_ = (folder / file_name).string();
  file_ = std::fopen(event_file_.c_str(), "ab");
  KILN_CHECK(file_ != nullptr, "TensorBoardLogger: cannot open '", event_file_, "' for writing: ",
             std::strerror(errno));
  std::string first;
  put_double(first, 1, wall_time_now());
  put_bytes(first, 3, "brain.Event:2");
  write_event(first);
  flush(false);  // TensorBoard finds the run as soon as the file has its header
}

TensorBoardLogger::~TensorBoardLogger() {
  if (file_ != nullptr) {
    std::fflush(file_);
    std::fclose(file_);
  }
}

void TensorBoardLogger::write_event(const std::string& event) {
  const std::string record = tfrecord(event);
  const size_t written = std::fwrite(record.data(), 1, record.size(), file_);
  KILN_CHECK(written == record.size(), "TensorBoardLogger: cannot write to '", event_file_, "': ",
             std::strerror(errno));
}

void TensorBoardLogger::flush(bool sync) {
  KILN_CHECK(std::fflush(file_) == 0, "TensorBoardLogger: cannot flush '", event_file_, "': ", std::strerror(errno));
  if (sync) {
    KILN_CHECK(::fsync(::fileno(file_)) == 0, "TensorBoardLogger: cannot fsync '", event_file_,
               "': ", std::strerror(errno));
  }
  last_flush_ = std::chrono::steady_clock::now();
}

void TensorBoardLogger::log_metrics(const std::map<std::string, double>& metrics, int64_t step, int64_t epoch) {
  std::string summary;  // Summary { repeated Value value = 1 }
  for (const auto& [tag, value] : metrics) put_bytes(summary, 1, scalar_value(tag, value));
  if (metrics.find("epoch") == metrics.end()) put_bytes(summary, 1, scalar_value("epoch", static_cast<double>(epoch)));
  write_event(event(step, 5, summary));
  if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last_flush_).count() >= flush_secs_) {
    flush(false);
  }
}

void TensorBoardLogger::log_hyperparams(const std::map<std::string, std::string>& hparams) {
  const fs::path path = fs::path(log_dir_) / "hparams.yaml";
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

}  // namespace kiln
