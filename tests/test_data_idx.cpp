// IDX reader: every malformed-file case gives a kiln::Error that names the
// file and the problem (files are built byte by byte in a temporary folder).
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "data/fashion_mnist.h"
#include "data/idx.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-idx-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path, error);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

using Bytes = std::vector<uint8_t>;

void put_be32(Bytes& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(value >> shift));
}

Bytes idx_header(uint8_t type, const std::vector<uint32_t>& dims) {
  Bytes bytes{0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_be32(bytes, d);
  return bytes;
}

// An images file (N, H, W) of uint8 with pixel values (i * 7 + k) % 256.
Bytes images_file(uint32_t n, uint32_t h, uint32_t w) {
  Bytes bytes = idx_header(0x08, {n, h, w});
  for (uint32_t i = 0; i < n * h * w; ++i) bytes.push_back(static_cast<uint8_t>((i * 7) % 256));
  return bytes;
}

Bytes labels_file(const std::vector<uint8_t>& labels) {
  Bytes bytes = idx_header(0x08, {static_cast<uint32_t>(labels.size())});
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  return bytes;
}

Bytes gzip(const Bytes& raw) {
  z_stream stream{};
  REQUIRE(deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  Bytes out(deflateBound(&stream, raw.size()) + 64);
  stream.next_in = const_cast<Bytef*>(raw.data());
  stream.avail_in = static_cast<uInt>(raw.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&stream, Z_FINISH) == Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::string write(const TempDir& dir, const std::string& name, const Bytes& bytes) {
  std::string path = dir.file(name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

using testing::error_of;

#define CHECK_ERROR_HAS(message, ...)                                                   \
  do {                                                                                  \
    for (const char* expected : {__VA_ARGS__}) {                                        \
      CHECK_MESSAGE((message).find(expected) != std::string::npos, "expected '", expected, \
                    "' in: ", (message));                                               \
    }                                                                                   \
  } while (0)

}  // namespace

TEST_CASE("idx: a valid uint8 file reads back, raw and gzip") {
  TempDir dir;
  Bytes raw = images_file(3, 2, 4);
  for (const std::string& path : {write(dir, "raw-idx3-ubyte", raw), write(dir, "gz-idx3-ubyte.gz", gzip(raw))}) {
    Tensor t = read_idx(path, IdxRole::images);
    CHECK(t.dtype() == DType::u8);
    CHECK(t.shape() == Shape{3, 2, 4});
    const uint8_t* values = t.data<uint8_t>();
    for (int i = 0; i < 24; ++i) CHECK(values[i] == static_cast<uint8_t>((i * 7) % 256));
  }
}

TEST_CASE("idx: big-endian int16, int32, float32 and float64 payloads convert") {
  TempDir dir;
  Bytes i16 = idx_header(0x0B, {2});
  i16.insert(i16.end(), {0xFF, 0xFE, 0x01, 0x00});  // -2, 256
  Tensor a = read_idx(write(dir, "i16", i16));
  CHECK(a.dtype() == DType::i32);
  CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{-2, 256});

  Bytes i32 = idx_header(0x0C, {1, 1});
  put_be32(i32, 0xFFFFFFFFu);
  CHECK(read_idx(write(dir, "i32", i32)).to_vector<int32_t>() == std::vector<int32_t>{-1});

  Bytes f32 = idx_header(0x0D, {1});
  put_be32(f32, 0x3FC00000u);  // 1.5f
  CHECK(read_idx(write(dir, "f32", f32)).to_vector<float>() == std::vector<float>{1.5f});

  Bytes f64 = idx_header(0x0E, {1});
  put_be32(f64, 0xC0040000u);  // -2.5
  put_be32(f64, 0);
  CHECK(read_idx(write(dir, "f64", f64)).to_vector<double>() == std::vector<double>{-2.5});

  Bytes i8 = idx_header(0x09, {1});
  i8.push_back(0x80);
  CHECK(read_idx(write(dir, "i8", i8)).to_vector<int32_t>() == std::vector<int32_t>{-128});
}

TEST_CASE("idx: wrong magic number") {
  TempDir dir;
  Bytes bytes = images_file(1, 2, 2);
  bytes[0] = 0x12;
  std::string path = write(dir, "bad-magic", bytes);
  CHECK_ERROR_HAS(error_of([&] { read_idx(path); }), path.c_str(), "not an IDX file", "bad magic number 0x12000803");
  // A file that is text, not IDX at all.
  std::string text = write(dir, "text", Bytes{'h', 'e', 'l', 'l', 'o'});
  CHECK_ERROR_HAS(error_of([&] { read_idx(text); }), "bad magic number");
}

TEST_CASE("idx: wrong type byte") {
  TempDir dir;
  Bytes bytes = images_file(1, 2, 2);
  bytes[2] = 0x07;
  std::string path = write(dir, "bad-type", bytes);
  CHECK_ERROR_HAS(error_of([&] { read_idx(path); }), path.c_str(), "unknown IDX type byte 0x07");
  // A valid type that the role does not allow: float32 images.
  Bytes floats = idx_header(0x0D, {1, 1, 1});
  put_be32(floats, 0);
  std::string floats_path = write(dir, "float-images", floats);
  CHECK_ERROR_HAS(error_of([&] { read_idx(floats_path, IdxRole::images); }), floats_path.c_str(),
                  "wrong IDX type byte 0x0D (float32) for an images file");
}

TEST_CASE("idx: wrong number of dimensions for the file's role") {
  TempDir dir;
  std::string labels_as_images = write(dir, "labels", labels_file({1, 2, 3}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(labels_as_images, IdxRole::images); }), labels_as_images.c_str(),
                  "wrong number of dimensions 1 for an images file (expected 3");
  std::string images_as_labels = write(dir, "images", images_file(2, 2, 2));
  CHECK_ERROR_HAS(error_of([&] { read_idx(images_as_labels, IdxRole::labels); }),
                  "wrong number of dimensions 3 for a labels file (expected 1");
  std::string zero = write(dir, "zero-dims", idx_header(0x08, {}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(zero); }), "0 dimensions");
}

TEST_CASE("idx: truncated header and truncated payload") {
  TempDir dir;
  std::string empty_file = write(dir, "empty", {});
  CHECK_ERROR_HAS(error_of([&] { read_idx(empty_file); }), empty_file.c_str(), "truncated IDX header");
  Bytes header_cut = images_file(1, 2, 2);
  header_cut.resize(10);  // 3 dims need 16 header bytes
  CHECK_ERROR_HAS(error_of([&] { read_idx(write(dir, "header-cut", header_cut)); }), "truncated IDX header",
                  "need 16");
  Bytes payload_cut = images_file(3, 4, 4);
  payload_cut.resize(payload_cut.size() - 5);
  std::string path = write(dir, "payload-cut", payload_cut);
  CHECK_ERROR_HAS(error_of([&] { read_idx(path, IdxRole::images); }), path.c_str(), "truncated payload",
                  "3x4x4 uint8 = 48 bytes but only 43 follow");
}

TEST_CASE("idx: trailing bytes after the payload") {
  TempDir dir;
  Bytes bytes = images_file(2, 2, 2);
  bytes.insert(bytes.end(), {1, 2, 3});
  std::string path = write(dir, "trailing", bytes);
  CHECK_ERROR_HAS(error_of([&] { read_idx(path, IdxRole::images); }), path.c_str(),
                  "3 trailing bytes after the 8-byte payload");
}

TEST_CASE("idx: huge dimensions overflow or exceed the file, without allocating") {
  TempDir dir;
  std::string overflow = write(dir, "overflow", idx_header(0x08, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(overflow, IdxRole::images); }), overflow.c_str(),
                  "dimensions 4294967295x4294967295x4294967295 overflow");
  // float64 elements: 2^62 * 8 overflows only through the element size.
  std::string size_overflow = write(dir, "size-overflow", idx_header(0x0E, {1u << 31, 1u << 31}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(size_overflow); }), "overflow");
  // 2^48 bytes fit in 64 bits but not in the file: an error, not an allocation.
  std::string huge = write(dir, "huge", idx_header(0x08, {65536, 65536, 65536}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(huge, IdxRole::images); }), "truncated payload");
  std::string huge_gz = write(dir, "huge.gz", gzip(idx_header(0x08, {65536, 65536, 65536})));
  CHECK_ERROR_HAS(error_of([&] { read_idx(huge_gz, IdxRole::images); }), "truncated payload");
}

TEST_CASE("idx: a zero size does not hide an overflow of the other sizes (fuzz finding)") {
  TempDir dir;
  // No payload, but the empty tensor's strides (the product of the other sizes) would overflow int64.
  std::string path = write(dir, "empty-overflow", idx_header(0x0B, {0xE8001600u, 0, 75, 0x7095BADFu}));
  CHECK_ERROR_HAS(error_of([&] { read_idx(path); }), path.c_str(), "dimensions 3892319744x0x75x1888860895 overflow",
                  "zero sizes counted as 1");
  // Empty files of sizes in range still read.
  Tensor none = read_idx(write(dir, "no-images", idx_header(0x08, {0, 28, 28})), IdxRole::images);
  CHECK(none.shape() == Shape{0, 28, 28});
  CHECK(read_idx(write(dir, "no-floats", idx_header(0x0D, {3, 0}))).shape() == Shape{3, 0});
}

TEST_CASE("idx: corrupted and truncated gzip") {
  TempDir dir;
  const Bytes compressed = gzip(images_file(4, 8, 8));
  {
    Bytes bad_crc = compressed;
    bad_crc[bad_crc.size() - 8] ^= 0x5A;  // the CRC-32 field of the trailer
    std::string path = write(dir, "bad-crc.gz", bad_crc);
    CHECK_ERROR_HAS(error_of([&] { read_idx(path); }), path.c_str(), "corrupted gzip data", "CRC-32 mismatch");
  }
  {
    Bytes bad_length = compressed;
    bad_length[bad_length.size() - 4] ^= 0x01;  // ISIZE
    CHECK_ERROR_HAS(error_of([&] { read_idx(write(dir, "bad-length.gz", bad_length)); }), "corrupted gzip data",
                    "length");
  }
  {
    Bytes bad_data = compressed;
    bad_data[bad_data.size() / 2] ^= 0xFF;  // inside the deflate stream
    CHECK_ERROR_HAS(error_of([&] { read_idx(write(dir, "bad-data.gz", bad_data)); }), "bad-data.gz");
  }
  for (size_t keep : {compressed.size() - 4, compressed.size() / 2, size_t{12}}) {
    Bytes cut(compressed.begin(), compressed.begin() + static_cast<std::ptrdiff_t>(keep));
    std::string path = write(dir, "cut.gz", cut);
    CHECK_ERROR_HAS(error_of([&] { read_idx(path); }), path.c_str(), "truncated gzip stream");
  }
  {
    Bytes trailing = compressed;
    trailing.insert(trailing.end(), {'x', 'y', 'z'});
    CHECK_ERROR_HAS(error_of([&] { read_idx(write(dir, "trailing.gz", trailing)); }),
                    "3 trailing bytes after the gzip stream");
  }
  {
    // Two concatenated gzip members are one valid stream (gzip's rule).
    Bytes raw = images_file(2, 2, 2);
    Bytes first(raw.begin(), raw.begin() + 10), second(raw.begin() + 10, raw.end());
    Bytes joined = gzip(first), tail = gzip(second);
    joined.insert(joined.end(), tail.begin(), tail.end());
    Tensor t = read_idx(write(dir, "members.gz", joined), IdxRole::images);
    CHECK(t.shape() == Shape{2, 2, 2});
  }
}

TEST_CASE("idx: a missing file names the file") {
  CHECK_ERROR_HAS(error_of([] { read_idx("/nonexistent/kiln/train-images-idx3-ubyte"); }),
                  "/nonexistent/kiln/train-images-idx3-ubyte: cannot open");
  // Neither a folder nor a device is read (a device would never end).
  CHECK_ERROR_HAS(error_of([] { read_idx("/dev/zero"); }), "/dev/zero: not a regular file");
  CHECK_ERROR_HAS(error_of([] { read_idx("/tmp"); }), "/tmp: not a regular file");
}

TEST_CASE("idx: images/labels count mismatch and labels out of range (via MNIST)") {
  TempDir dir;
  write(dir, "train-images-idx3-ubyte", images_file(3, 2, 2));
  write(dir, "train-labels-idx1-ubyte", labels_file({1, 2}));
  std::string message = error_of([&] { MNIST(MnistOptions{.root = dir.path.string(), .use_cache = false}); });
  CHECK_ERROR_HAS(message, "train-images-idx3-ubyte holds 3 images but", "train-labels-idx1-ubyte holds 2 labels");

  write(dir, "train-labels-idx1-ubyte", labels_file({1, 10, 2}));
  message = error_of([&] { MNIST(MnistOptions{.root = dir.path.string(), .use_cache = false}); });
  CHECK_ERROR_HAS(message, "train-labels-idx1-ubyte", "label 10 at index 1 is out of range (expected 0..9");
  // The same checks guard the cached path.
  message = error_of([&] { MNIST(MnistOptions{.root = dir.path.string(), .cache_dir = dir.path.string()}); });
  CHECK_ERROR_HAS(message, "label 10 at index 1 is out of range");

  write(dir, "train-labels-idx1-ubyte", labels_file({1, 9, 2}));
  MNIST ok(MnistOptions{.root = dir.path.string(), .use_cache = false});
  CHECK(ok.size() == 3);
}

TEST_CASE("idx: a missing data set says how to install it") {
  std::string message = error_of([] { FashionMNIST(MnistOptions{.root = "/nonexistent/fashion"}); });
  CHECK_ERROR_HAS(message, "FashionMNIST: data set not found", "train-images-idx3-ubyte", "/nonexistent/fashion",
                  "apt-get install dataset-fashion-mnist");
  message = error_of([] { MNIST(MnistOptions{.root = "/nonexistent/mnist", .train = false}); });
  CHECK_ERROR_HAS(message, "MNIST: data set not found", "t10k-images-idx3-ubyte", "MnistOptions::root");
}
