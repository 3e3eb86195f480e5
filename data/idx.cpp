// IDX reading: whole-file read, gunzip with zlib, then strict parsing.
#include "data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/extent.h"

namespace kiln {

namespace {

constexpr uint8_t kGzipMagic0 = 0x1f, kGzipMagic1 = 0x8b;

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};

std::vector<uint8_t> read_raw(const std::string& path) {
  // Checked before opening: a FIFO would block in open, a device (/dev/zero) never end.
  struct stat info{};
  KILN_CHECK(stat(path.c_str(), &info) == 0, path, ": cannot open: ", std::strerror(errno));
  KILN_CHECK(S_ISREG(info.st_mode), path, ": not a regular file");
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  KILN_CHECK(file != nullptr, path, ": cannot open: ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  // Read to EOF instead of trusting a size from stat: pipes and files that
  // change while read both stay correct.
  if (std::fseek(file.get(), 0, SEEK_END) == 0) {
    long size = std::ftell(file.get());
    if (size > 0) bytes.reserve(static_cast<size_t>(size));
    std::rewind(file.get());
  }
  for (;;) {
    size_t got = std::fread(chunk, 1, sizeof(chunk), file.get());
    bytes.insert(bytes.end(), chunk, chunk + got);
    if (got < sizeof(chunk)) {
      KILN_CHECK(!std::ferror(file.get()), path, ": read error: ", std::strerror(errno));
      break;
    }
  }
  return bytes;
}

}  // namespace

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& path) {
  // Size hint: the last member's ISIZE trailer (length mod 2^32), bounded by
  // deflate's largest ratio (1032:1) so that a corrupted trailer cannot make
  // us reserve absurd amounts. The buffer grows if the hint is short.
  size_t hint = compressed.size() * 4;
  if (compressed.size() >= 18) {
    const uint8_t* t = compressed.data() + compressed.size() - 4;
    size_t isize = t[0] | (t[1] << 8) | (t[2] << 16) | (static_cast<size_t>(t[3]) << 24);
    hint = std::min(isize, compressed.size() * 1032);
  }
  std::vector<uint8_t> out(std::max<size_t>(hint, 1024));
  size_t produced = 0;

  z_stream stream{};
  KILN_CHECK(inflateInit2(&stream, 15 + 16) == Z_OK, path, ": zlib inflateInit2 failed");  // 16: gzip only
  struct End {
    z_stream* s;
    ~End() { inflateEnd(s); }
  } end{&stream};

  size_t consumed = 0;
  stream.next_in = const_cast<Bytef*>(compressed.data());
  for (;;) {
    // zlib counts in uInt; feed and drain in pieces of at most 1 GiB.
    size_t in_left = compressed.size() - consumed;
    stream.avail_in = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
    stream.next_in = const_cast<Bytef*>(compressed.data() + consumed);
    if (produced == out.size()) out.resize(out.size() * 2);
    size_t out_left = out.size() - produced;
    stream.avail_out = static_cast<uInt>(std::min<size_t>(out_left, 1u << 30));
    stream.next_out = out.data() + produced;
    const uInt avail_in_before = stream.avail_in, avail_out_before = stream.avail_out;

    int status = inflate(&stream, Z_NO_FLUSH);
    consumed += avail_in_before - stream.avail_in;
    produced += avail_out_before - stream.avail_out;

    if (status == Z_STREAM_END) {
      // Another gzip member may follow (gzip concatenates them); anything else is trailing garbage.
      if (consumed == compressed.size()) break;
      KILN_CHECK(compressed.size() - consumed >= 2 && compressed[consumed] == kGzipMagic0 &&
                     compressed[consumed + 1] == kGzipMagic1,
                 path, ": ", compressed.size() - consumed, " trailing bytes after the gzip stream");
      KILN_CHECK(inflateReset(&stream) == Z_OK, path, ": zlib inflateReset failed");
      continue;
    }
    if (status == Z_DATA_ERROR) {
      std::string what = stream.msg ? stream.msg : "invalid deflate data";
      if (what == "incorrect data check") what += " (CRC-32 mismatch)";
      if (what == "incorrect length check") what += " (uncompressed length mismatch)";
      KILN_THROW(path, ": corrupted gzip data: ", what);
    }
    KILN_CHECK(status != Z_MEM_ERROR, path, ": out of memory while decompressing");
    KILN_CHECK(status == Z_OK || status == Z_BUF_ERROR, path, ": zlib inflate failed (status ", status, ")");
    // No progress possible: input exhausted before the stream's end.
    if (consumed == compressed.size() && produced < out.size()) {
      KILN_THROW(path, ": truncated gzip stream (the file ends before the end of the compressed data)");
    }
  }
  out.resize(produced);
  return out;
}

namespace {

// Type byte -> (element size, name).
struct IdxType {
  uint8_t code;
  int size;
  const char* name;
};
constexpr IdxType kIdxTypes[] = {{0x08, 1, "uint8"},   {0x09, 1, "int8"},    {0x0B, 2, "int16"},
                                 {0x0C, 4, "int32"},   {0x0D, 4, "float32"}, {0x0E, 8, "float64"}};

std::string hex_byte(uint8_t value) {
  char text[8];
  std::snprintf(text, sizeof(text), "0x%02X", value);
  return text;
}

uint32_t load_be32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | p[3];
}

template <typename Wide, typename Narrow>
void convert_big_endian(const uint8_t* source, Wide* out, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    std::make_unsigned_t<Narrow> bits = 0;
    for (size_t b = 0; b < sizeof(Narrow); ++b) {
      bits = static_cast<decltype(bits)>((bits << 8) | source[i * sizeof(Narrow) + b]);
    }
    Narrow value;
    std::memcpy(&value, &bits, sizeof(Narrow));
    out[i] = static_cast<Wide>(value);
  }
}

template <typename T>
void convert_float_big_endian(const uint8_t* source, T* out, int64_t count) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  for (int64_t i = 0; i < count; ++i) {
    Bits bits = 0;
    for (size_t b = 0; b < sizeof(T); ++b) bits = (bits << 8) | source[i * sizeof(T) + b];
    std::memcpy(&out[i], &bits, sizeof(T));
  }
}

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::vector<uint8_t> bytes = read_raw(path);
  if (bytes.size() >= 2 && bytes[0] == kGzipMagic0 && bytes[1] == kGzipMagic1) return gunzip(bytes, path);
  return bytes;
}

Tensor parse_idx(std::vector<uint8_t> bytes, const std::string& name, IdxRole role) {
  KILN_CHECK(bytes.size() >= 4, name, ": truncated IDX header (", bytes.size(), " bytes; the magic number alone is 4)");
  KILN_CHECK(bytes[0] == 0 && bytes[1] == 0, name, ": not an IDX file: bad magic number ", hex_byte(bytes[0]),
             hex_byte(bytes[1]).substr(2), hex_byte(bytes[2]).substr(2), hex_byte(bytes[3]).substr(2),
             " (expected 0x0000, then a type byte and a dimension count)");
  const uint8_t type_code = bytes[2];
  const int ndim = bytes[3];
  const IdxType* type = nullptr;
  for (const IdxType& candidate : kIdxTypes) {
    if (candidate.code == type_code) type = &candidate;
  }
  KILN_CHECK(type != nullptr, name, ": unknown IDX type byte ", hex_byte(type_code),
             " (expected 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32 or 0x0E float64)");
  if (role != IdxRole::any) {
    const char* role_name = role == IdxRole::images ? "an images" : "a labels";
    const int expected_ndim = role == IdxRole::images ? 3 : 1;
    KILN_CHECK(type_code == 0x08, name, ": wrong IDX type byte ", hex_byte(type_code), " (", type->name, ") for ",
               role_name, " file (expected 0x08, uint8)");
    KILN_CHECK(ndim == expected_ndim, name, ": wrong number of dimensions ", ndim, " for ", role_name,
               " file (expected ", expected_ndim, role == IdxRole::images ? ": count, rows, columns)" : ": count)");
  }
  KILN_CHECK(ndim >= 1, name, ": IDX header has 0 dimensions (expected at least 1)");
  const size_t header_bytes = 4 + 4 * static_cast<size_t>(ndim);
  KILN_CHECK(bytes.size() >= header_bytes, name, ": truncated IDX header (", bytes.size(), " bytes; ", ndim,
             " dimensions need ", header_bytes, ")");

  Shape shape(ndim);
  std::string dims_text;
  for (int d = 0; d < ndim; ++d) {
    shape[d] = load_be32(bytes.data() + 4 + 4 * d);
    dims_text += (d ? "x" : "") + std::to_string(shape[d]);
  }
  // 0x2^32x2^32x2^32 holds nothing, but an empty tensor's strides would overflow.
  const std::optional<ContiguousExtent> extent = contiguous_extent(shape, static_cast<int64_t>(type->size));
  KILN_CHECK(extent.has_value(), name, ": dimensions ", dims_text, " overflow: their product (zero sizes counted as 1)",
             " or its product with the ", type->size, "-byte element size does not fit in 64 bits");
  const int64_t numel = extent->numel;
  const uint64_t payload = static_cast<uint64_t>(extent->nbytes);
  const uint64_t available = bytes.size() - header_bytes;
  KILN_CHECK(available >= payload, name, ": truncated payload: the header says ", dims_text, " ", type->name, " = ",
             payload, " bytes but only ", available, " follow the ", header_bytes, "-byte header");
  KILN_CHECK(available == payload, name, ": ", available - payload, " trailing bytes after the ", payload,
             "-byte payload (header says ", dims_text, " ", type->name, ")");

  const uint8_t* source = bytes.data() + header_bytes;
  switch (type_code) {
    case 0x08: {
      // Zero copy: the tensor owns the decoded bytes.
      auto* owner = new std::vector<uint8_t>(std::move(bytes));
      return from_blob(owner->data() + header_bytes, shape, DType::u8, Device::cpu(),
                       [owner](void*) { delete owner; });
    }
    case 0x09: {
      Tensor out = empty(shape, {.dtype = DType::i32});
      convert_big_endian<int32_t, int8_t>(source, out.data<int32_t>(), numel);
      return out;
    }
    case 0x0B: {
      Tensor out = empty(shape, {.dtype = DType::i32});
      convert_big_endian<int32_t, int16_t>(source, out.data<int32_t>(), numel);
      return out;
    }
    case 0x0C: {
      Tensor out = empty(shape, {.dtype = DType::i32});
      convert_big_endian<int32_t, int32_t>(source, out.data<int32_t>(), numel);
      return out;
    }
    case 0x0D: {
      Tensor out = empty(shape, {.dtype = DType::f32});
      convert_float_big_endian(source, out.data<float>(), numel);
      return out;
    }
    default: {
      Tensor out = empty(shape, {.dtype = DType::f64});
      convert_float_big_endian(source, out.data<double>(), numel);
      return out;
    }
  }
}

Tensor read_idx(const std::string& path, IdxRole role) { return parse_idx(read_file_bytes(path), path, role); }

void check_idx_images_labels(const Tensor& images, const Tensor& labels, int64_t num_classes,
                             const std::string& images_path, const std::string& labels_path) {
  KILN_CHECK(images.size(0) == labels.size(0), images_path, " holds ", images.size(0), " images but ", labels_path,
             " holds ", labels.size(0), " labels (expected the same count)");
  KILN_CHECK(labels.dtype() == DType::u8 && labels.dim() == 1 && labels.is_contiguous(), labels_path,
             ": expected a 1-dim uint8 labels tensor");
  const uint8_t* values = labels.data<uint8_t>();
  for (int64_t i = 0; i < labels.numel(); ++i) {
    KILN_CHECK(values[i] < num_classes, labels_path, ": label ", static_cast<int>(values[i]), " at index ", i,
               " is out of range (expected 0..", num_classes - 1, " for ", num_classes, " classes)");
  }
}

}  // namespace kiln
