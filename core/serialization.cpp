#include "core/serialization.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/extent.h"

namespace kiln {

namespace {

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
    case DType::b8: return "BOOL";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType* dtype) {
  static const std::pair<const char*, DType> table[] = {{"F32", DType::f32}, {"F64", DType::f64},
                                                        {"F16", DType::f16}, {"BF16", DType::bf16},
                                                        {"I32", DType::i32}, {"I64", DType::i64},
                                                        {"U8", DType::u8},   {"BOOL", DType::b8}};
  for (const auto& [text, value] : table) {
    if (name == text) {
      *dtype = value;
      return true;
    }
  }
  return false;
}

// A JSON array of non-negative integers. Floats, negatives and bools are
// refused, not converted: a float out of range converts with undefined behaviour.
bool unsigned_integers(const nlohmann::json& value, std::vector<uint64_t>* out) {
  if (!value.is_array()) return false;
  for (const nlohmann::json& item : value) {
    if (!item.is_number_unsigned()) return false;
    out->push_back(item.get<uint64_t>());
  }
  return true;
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = ::write(fd, cursor, bytes);
    if (written < 0 && errno == EINTR) continue;
    KILN_CHECK(written > 0, "save_safetensors: writing '", path, "' failed: ", std::strerror(errno));
    cursor += written;
    bytes -= static_cast<size_t>(written);
  }
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensorList& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> host;
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    KILN_CHECK(name != "__metadata__" && !name.empty(), "save_safetensors: invalid tensor name '", name, "'");
    KILN_CHECK(!header.contains(name), "save_safetensors: duplicate tensor name '", name, "'");
    KILN_CHECK(tensor.defined(), "save_safetensors: tensor '", name, "' is undefined");
    Tensor dense = tensor.detach().to(Device::cpu()).contiguous();
    host.push_back(dense);
    header[name] = {{"dtype", safetensors_dtype(dense.dtype())},
                    {"shape", dense.shape()},
                    {"data_offsets", {offset, offset + dense.nbytes()}}};
    offset += dense.nbytes();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  const uint64_t header_size = header_text.size();

  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  KILN_CHECK(fs::is_directory(folder), "save_safetensors: folder '", folder.string(), "' of '", path,
             "' does not exist");
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "save_safetensors: cannot create '", temporary, "': ", std::strerror(errno));
  try {
    uint8_t length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(header_size >> (8 * i));
    write_all(fd, length, 8, temporary);
    write_all(fd, header_text.data(), header_text.size(), temporary);
    for (const Tensor& dense : host) write_all(fd, dense.data_ptr(), dense.nbytes(), temporary);
    KILN_CHECK(::fsync(fd) == 0, "save_safetensors: fsync of '", temporary, "' failed: ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    KILN_THROW("save_safetensors: cannot rename '", temporary, "' to '", path, "': ", reason);
  }
  // Make the rename itself durable.
  int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder_fd >= 0) {
    ::fsync(folder_fd);
    ::close(folder_fd);
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  KILN_CHECK(file.is_open(), "load_safetensors: cannot open '", path, "'");
  const uint64_t file_size = static_cast<uint64_t>(file.tellg());
  file.seekg(0);
  KILN_CHECK(file_size >= 8, "load_safetensors: '", path, "' is truncated (", file_size,
             " bytes, shorter than the 8-byte header length)");
  uint8_t length[8];
  file.read(reinterpret_cast<char*>(length), 8);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(length[i]) << (8 * i);
  KILN_CHECK(header_size <= file_size - 8, "load_safetensors: '", path, "' is truncated or corrupt: header of ",
             header_size, " bytes in a file of ", file_size, " bytes");
  std::string header_text(header_size, '\0');
  file.read(header_text.data(), static_cast<std::streamsize>(header_size));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load_safetensors: '", path, "' has a corrupt JSON header: ", error.what());
  }
  KILN_CHECK(header.is_object(), "load_safetensors: '", path, "': the header is not a JSON object");
  const uint64_t data_size = file_size - 8 - header_size;

  SafetensorsFile result;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      KILN_CHECK(info.is_object(), "load_safetensors: '", path, "': __metadata__ is not an object");
      for (auto& [key, value] : info.items()) {
        KILN_CHECK(value.is_string(), "load_safetensors: '", path, "': metadata '", key, "' is not a string");
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    try {
      Entry entry{name, DType::f32, {}, 0, 0};
      KILN_CHECK(parse_safetensors_dtype(info.at("dtype").get<std::string>(), &entry.dtype), "load_safetensors: '",
                 path, "': tensor '", name, "' has unsupported dtype ", info.at("dtype").dump());
      std::vector<uint64_t> shape, offsets;
      KILN_CHECK(unsigned_integers(info.at("shape"), &shape), "load_safetensors: '", path, "': tensor '", name,
                 "' has shape ", info.at("shape").dump(), " (expected an array of non-negative integers)");
      KILN_CHECK(unsigned_integers(info.at("data_offsets"), &offsets) && offsets.size() == 2, "load_safetensors: '",
                 path, "': tensor '", name, "' has data_offsets ", info.at("data_offsets").dump(),
                 " (expected two non-negative integers)");
      KILN_CHECK(offsets[0] <= offsets[1] && offsets[1] <= data_size, "load_safetensors: '", path, "': tensor '",
                 name, "' has data offsets outside the ", data_size, " data bytes");
      entry.begin = offsets[0];
      entry.end = offsets[1];
      for (uint64_t size : shape) {
        KILN_CHECK(size <= static_cast<uint64_t>(INT64_MAX), "load_safetensors: '", path, "': tensor '", name,
                   "' has shape ", info.at("shape").dump(), " whose sizes overflow 64 bits");
        entry.shape.push_back(static_cast<int64_t>(size));
      }
      // An empty tensor's strides count zero sizes as 1, so they must fit too.
      const std::optional<ContiguousExtent> extent =
          contiguous_extent(entry.shape, static_cast<int64_t>(dtype_size(entry.dtype)));
      KILN_CHECK(extent.has_value(), "load_safetensors: '", path, "': tensor '", name, "' has shape ",
                 info.at("shape").dump(), " whose sizes overflow 64 bits (zero sizes counted as 1)");
      KILN_CHECK(static_cast<uint64_t>(extent->nbytes) == entry.end - entry.begin, "load_safetensors: '", path,
                 "': tensor '", name, "' of shape ", shape_str(entry.shape), " needs ", extent->nbytes,
                 " bytes but has ", entry.end - entry.begin);
      entries.push_back(entry);
    } catch (const nlohmann::json::exception& error) {
      KILN_THROW("load_safetensors: '", path, "': malformed entry for tensor '", name, "': ", error.what());
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const Entry& entry : entries) {
    KILN_CHECK(entry.begin == covered, "load_safetensors: '", path, "': tensor '", entry.name,
               "' overlaps another or leaves a gap in the data");
    covered = entry.end;
  }
  KILN_CHECK(covered == data_size, "load_safetensors: '", path, "' has ", data_size - covered,
             " trailing bytes after the last tensor (corrupt or truncated file)");
  for (const Entry& entry : entries) {
    Tensor tensor = empty(entry.shape, {.dtype = entry.dtype});
    file.seekg(static_cast<std::streamoff>(8 + header_size + entry.begin));
    file.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(entry.end - entry.begin));
    KILN_CHECK(file.good() || entry.end == entry.begin, "load_safetensors: reading '", path, "' failed");
    if (entry.dtype == DType::b8) {
      // Any other byte is not a bool: reading it as one is undefined behaviour.
      const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
      const uint64_t count = entry.end - entry.begin;
      const uint64_t bad = std::find_if(bytes, bytes + count, [](uint8_t byte) { return byte > 1; }) - bytes;
      KILN_CHECK(bad == count, "load_safetensors: '", path, "': BOOL tensor '", entry.name, "' holds the byte ",
                 static_cast<int>(bytes[bad]), " at element ", bad, " (expected 0 or 1)");
    }
    result.tensors.emplace_back(entry.name, tensor);
  }
  return result;
}

}  // namespace kiln
