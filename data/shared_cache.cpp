// File layout (little-endian, host order):
//   "KILNSHM1" | uint64 header length | JSON header | arrays, each at a 64-byte-aligned offset
// The header: {"key": ..., "size": file size, "arrays": [{"name", "dtype", "shape", "offset", "nbytes"}]}.
#include "data/shared_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/extent.h"

namespace kiln {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'H', 'M', '1'};
constexpr size_t kAlign = 64;

size_t align_up(size_t value) { return (value + kAlign - 1) / kAlign * kAlign; }

struct Mapping {
  void* address = MAP_FAILED;
  size_t length = 0;
  ~Mapping() {
    if (address != MAP_FAILED) munmap(address, length);
  }
};

struct Fd {
  int fd = -1;
  explicit Fd(int value) : fd(value) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

DType dtype_from_name(const std::string& name) { return parse_dtype(name); }

// Maps `path` and returns its arrays when it is a complete cache file with
// `key`, owned by this user; nullptr otherwise (the caller rebuilds).
std::shared_ptr<SharedArrays> try_map(const std::string& path, const std::string& key) {
  Fd file(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.fd < 0) return nullptr;
  struct stat info{};
  if (fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != geteuid()) return nullptr;
  const size_t length = static_cast<size_t>(info.st_size);
  if (length < 16) return nullptr;
  auto mapping = std::make_shared<Mapping>();
  // Private and writable: reads share the page cache; a stray write copies
  // one page instead of faulting.
  mapping->address = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, file.fd, 0);
  if (mapping->address == MAP_FAILED) return nullptr;
  mapping->length = length;
  const auto* base = static_cast<const char*>(mapping->address);
  if (std::memcmp(base, kMagic, sizeof(kMagic)) != 0) return nullptr;
  uint64_t header_length = 0;
  std::memcpy(&header_length, base + 8, 8);
  if (header_length > length - 16) return nullptr;
  try {
    nlohmann::json header = nlohmann::json::parse(base + 16, base + 16 + header_length);
    if (header.at("key").get<std::string>() != key || header.at("size").get<uint64_t>() != length) return nullptr;
    NamedTensors arrays;
    for (const auto& entry : header.at("arrays")) {
      const DType dtype = dtype_from_name(entry.at("dtype").get<std::string>());
      const Shape shape = entry.at("shape").get<Shape>();
      const uint64_t offset = entry.at("offset").get<uint64_t>(), nbytes = entry.at("nbytes").get<uint64_t>();
      if (offset % kAlign != 0 || offset > length || nbytes > length - offset) return nullptr;
      const std::optional<ContiguousExtent> extent = contiguous_extent(shape, static_cast<int64_t>(dtype_size(dtype)));
      if (!extent.has_value() || static_cast<uint64_t>(extent->nbytes) != nbytes) return nullptr;
      void* data = static_cast<char*>(mapping->address) + offset;
      arrays.emplace_back(entry.at("name").get<std::string>(),
                          from_blob(data, shape, dtype, Device::cpu(), [mapping](void*) {}));
    }
    return std::make_shared<SharedArrays>(std::move(arrays), path, true);
  } catch (const std::exception&) {
    return nullptr;  // unreadable header (an old format, a foreign file): rebuild
  }
}

bool write_all(int fd, const void* data, size_t bytes) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = write(fd, cursor, bytes);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return false;
    cursor += written;
    bytes -= static_cast<size_t>(written);
  }
  return true;
}

// Writes the arrays to a temporary file beside `path` and renames it into
// place. False (and nothing left behind) on any failure.
bool write_cache(const std::string& path, const std::string& key, const NamedTensors& arrays) {
  nlohmann::json entries = nlohmann::json::array();
  // Offsets depend on the header length, which depends on the offsets: lay
  // out with a fixed-width header reservation (the JSON is padded with spaces).
  size_t payload_offset = 0;
  std::vector<size_t> offsets;
  for (const auto& [name, tensor] : arrays) {
    offsets.push_back(payload_offset);
    payload_offset = align_up(payload_offset + tensor.nbytes());
  }
  auto make_header = [&](size_t data_start, size_t file_size) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < arrays.size(); ++i) {
      list.push_back({{"name", arrays[i].first},
                      {"dtype", std::string(dtype_name(arrays[i].second.dtype()))},
                      {"shape", arrays[i].second.shape()},
                      {"offset", data_start + offsets[i]},
                      {"nbytes", arrays[i].second.nbytes()}});
    }
    return nlohmann::json{{"key", key}, {"size", file_size}, {"arrays", list}}.dump();
  };
  // Twice the length of a header with generous numbers is an upper bound.
  size_t reserve = align_up(16 + make_header(size_t{1} << 60, size_t{1} << 60).size() + 64) - 16;
  const size_t data_start = 16 + reserve;
  const size_t file_size = data_start + payload_offset;
  std::string header = make_header(data_start, file_size);
  if (header.size() > reserve) return false;
  header.resize(reserve, ' ');

  std::random_device entropy;
  const std::string temporary = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(entropy());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  const uint64_t header_length = reserve;
  ok = ok && write_all(fd, kMagic, sizeof(kMagic));
  ok = ok && write_all(fd, &header_length, 8);
  ok = ok && write_all(fd, header.data(), header.size());
  static const char zeros[kAlign] = {};
  size_t position = data_start;
  for (size_t i = 0; ok && i < arrays.size(); ++i) {
    const size_t target = data_start + offsets[i];
    ok = ok && write_all(fd, zeros, target - position);
    ok = ok && write_all(fd, arrays[i].second.data_ptr(), arrays[i].second.nbytes());
    position = target + arrays[i].second.nbytes();
  }
  ok = ok && write_all(fd, zeros, file_size - position);
  // Durable before visible: a crash never leaves a renamed, partly written file.
  ok = ok && fdatasync(fd) == 0;
  ok = (close(fd) == 0) && ok;
  ok = ok && std::rename(temporary.c_str(), path.c_str()) == 0;
  if (!ok) unlink(temporary.c_str());
  return ok;
}

std::shared_ptr<SharedArrays> in_memory(NamedTensors arrays, const std::string& path) {
  return std::make_shared<SharedArrays>(std::move(arrays), path, false);
}

NamedTensors checked_build(const std::function<NamedTensors()>& build, const std::string& name) {
  NamedTensors arrays = build();
  for (auto& [array_name, tensor] : arrays) {
    KILN_ASSERT(tensor.defined() && tensor.is_cpu(), "shared cache ", name, ": array ", array_name,
                " must be a defined cpu tensor");
    tensor = tensor.contiguous();
  }
  return arrays;
}

}  // namespace

SharedArrays::SharedArrays(NamedTensors arrays, std::string path, bool mapped)
    : arrays_(std::move(arrays)), path_(std::move(path)), mapped_(mapped) {}

Tensor SharedArrays::get(const std::string& name) const {
  for (const auto& [array_name, tensor] : arrays_) {
    if (array_name == name) return tensor;
  }
  KILN_THROW("shared cache ", path_, ": no array named '", name, "'");
}

std::string default_cache_dir() {
  if (access("/dev/shm", W_OK | X_OK) == 0 && std::filesystem::is_directory("/dev/shm")) return "/dev/shm";
  std::error_code error;
  std::filesystem::path temporary = std::filesystem::temp_directory_path(error);
  return error ? std::string("/tmp") : temporary.string();
}

std::string hash_hex(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

std::string file_key(const std::string& path) {
  struct stat info{};
  KILN_CHECK(stat(path.c_str(), &info) == 0, path, ": cannot stat: ", std::strerror(errno));
  std::error_code error;
  std::filesystem::path canonical = std::filesystem::weakly_canonical(path, error);
  return (error ? path : canonical.string()) + ":" + std::to_string(info.st_size) + ":" +
         std::to_string(static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec);
}

std::shared_ptr<SharedArrays> load_shared_cache(const std::string& name, const std::string& key,
                                                const std::function<NamedTensors()>& build, const std::string& dir,
                                                bool* rebuilt) {
  for (char c : name) {
    KILN_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.',
               "load_shared_cache: name '", name, "' may hold only letters, digits, '-', '_' and '.'");
  }
  if (rebuilt) *rebuilt = false;
  const std::string folder = dir.empty() ? default_cache_dir() : dir;
  // The user id in the name: /dev/shm is shared, and another user's file is neither trusted nor replaceable.
  const std::string path = folder + "/kiln-" + std::to_string(geteuid()) + "-" + name + ".bin";
  if (auto arrays = try_map(path, key)) return arrays;

  Fd lock(open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0) {
    if (rebuilt) *rebuilt = true;
    return in_memory(checked_build(build, name), path);
  }
  // Blocks (no spinning) while another process builds the same cache.
  while (flock(lock.fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  if (auto arrays = try_map(path, key)) return arrays;  // built while we waited
  if (rebuilt) *rebuilt = true;
  NamedTensors arrays = checked_build(build, name);
  if (write_cache(path, key, arrays)) {
    if (auto mapped = try_map(path, key)) return mapped;
  }
  return in_memory(std::move(arrays), path);  // the lock is released when `lock` closes
}

}  // namespace kiln
