#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/serialization.h"
#include "tests/support/test_util.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {
fs::path temp_folder() {
  fs::path folder = fs::temp_directory_path() / ("kiln_serialization_" + std::to_string(::getpid()));
  fs::create_directories(folder);
  return folder;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void check_load_fails(const fs::path& path, const std::string& expected_words) {
  try {
    load_safetensors(path.string());
    FAIL("load_safetensors accepted a bad file; expected an error containing '" << expected_words << "'");
  } catch (const Error& error) {
    const std::string message = error.what();
    CHECK_MESSAGE(message.find(expected_words) != std::string::npos, message);
    CHECK_MESSAGE(message.find(path.string()) != std::string::npos, "the message must name the file: " << message);
  }
}
}  // namespace

TEST_CASE("safetensors round trip keeps names, dtypes, shapes, values and metadata") {
  fs::path folder = temp_folder();
  fs::path path = folder / "weights.safetensors";
  Tensor a = tensor<float>({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f}, {2, 3});
  Tensor b = tensor<int64_t>({1, 2, 3}, {3});
  Tensor c = tensor<double>({0.1, 0.2}, {2}).to(DType::bf16);
  Tensor strided = tensor<float>({1, 2, 3, 4}, {2, 2}).t();  // non-contiguous: saved densely
  save_safetensors(path.string(), {{"layer.weight", a}, {"step", b}, {"half", c}, {"t", strided}},
                   {{"epoch", "3"}, {"format", "pt"}});
  SafetensorsFile loaded = load_safetensors(path.string());
  REQUIRE(loaded.tensors.size() == 4);
  CHECK(loaded.metadata.at("epoch") == "3");
  CHECK(loaded.tensors[0].first == "layer.weight");
  CHECK(loaded.tensors[0].second.shape() == Shape{2, 3});
  CHECK(loaded.tensors[0].second.to_vector<float>() == a.to_vector<float>());
  CHECK(loaded.tensors[1].second.dtype() == DType::i64);
  CHECK(loaded.tensors[1].second.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3});
  CHECK(loaded.tensors[2].second.dtype() == DType::bf16);
  CHECK(loaded.tensors[3].second.to_vector<float>() == std::vector<float>{1, 3, 2, 4});
  // The header length is little-endian and the data starts 8-byte aligned.
  std::string bytes = read_bytes(path);
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i) header |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  CHECK(header % 8 == 0);
  CHECK(bytes.substr(8, 1) == "{");
  fs::remove_all(folder);
}

TEST_CASE("safetensors save is atomic: a failed save leaves the previous file intact") {
  fs::path folder = temp_folder();
  fs::path path = folder / "ckpt.safetensors";
  save_safetensors(path.string(), {{"w", tensor<float>({1, 2}, {2})}});
  const std::string before = read_bytes(path);
  // An undefined tensor makes the save fail before anything is written over the file.
  CHECK_THROWS_AS(save_safetensors(path.string(), {{"w", Tensor()}}), Error);
  CHECK(read_bytes(path) == before);
  // No temporary files are left behind.
  int files = 0;
  for (auto& entry : fs::directory_iterator(folder)) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
  CHECK_THROWS_WITH_AS(save_safetensors((folder / "missing" / "x.safetensors").string(), {}),
                       doctest::Contains("does not exist"), Error);
  fs::remove_all(folder);
}

TEST_CASE("safetensors load rejects truncated, corrupt and inconsistent files with the file's name") {
  fs::path folder = temp_folder();
  fs::path good = folder / "good.safetensors";
  save_safetensors(good.string(), {{"w", tensor<float>({1, 2, 3, 4}, {4})}});
  const std::string bytes = read_bytes(good);

  fs::path tiny = folder / "tiny.safetensors";
  write_bytes(tiny, bytes.substr(0, 5));
  check_load_fails(tiny, "truncated");

  fs::path cut = folder / "cut.safetensors";
  write_bytes(cut, bytes.substr(0, bytes.size() - 3));
  check_load_fails(cut, "data offsets outside");

  fs::path trailing = folder / "trailing.safetensors";
  write_bytes(trailing, bytes + "xyz");
  check_load_fails(trailing, "trailing bytes");

  fs::path corrupt = folder / "corrupt.safetensors";
  std::string broken = bytes;
  broken[9] = '#';
  write_bytes(corrupt, broken);
  check_load_fails(corrupt, "corrupt JSON header");

  fs::path huge = folder / "huge.safetensors";
  std::string big_header = bytes;
  big_header[7] = '\x7f';
  write_bytes(huge, big_header);
  check_load_fails(huge, "truncated or corrupt");

  check_load_fails(folder / "absent.safetensors", "cannot open");
  fs::remove_all(folder);
}

namespace {
// A safetensors file from its JSON header and data (the header length is prepended).
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  return bytes + header + data;
}
}  // namespace

TEST_CASE("safetensors load rejects a BOOL byte other than 0 or 1 (fuzz finding)") {
  fs::path folder = temp_folder();
  fs::path good = folder / "mask.safetensors";
  const std::string header = R"({"mask":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  write_bytes(good, safetensors_bytes(header, std::string("\x01\x00\x01", 3)));
  CHECK(load_safetensors(good.string()).tensors.at(0).second.to(DType::f32).to_vector<float>() ==
        std::vector<float>{1, 0, 1});
  fs::path bad = folder / "bad-mask.safetensors";
  write_bytes(bad, safetensors_bytes(header, std::string("\x01\x00\x5b", 3)));
  check_load_fails(bad, "BOOL tensor 'mask' holds the byte 91 at element 2 (expected 0 or 1)");
  fs::remove_all(folder);
}

TEST_CASE("safetensors load rejects shapes and offsets that are not non-negative integers (fuzz finding)") {
  fs::path folder = temp_folder();
  fs::path path = folder / "bad.safetensors";
  const std::string data(8, '\0');
  auto header = [](const std::string& shape, const std::string& offsets) {
    return R"({"w":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}";
  };
  // An integer too large for 64 bits is parsed as a float: converting it back was undefined behaviour.
  write_bytes(path, safetensors_bytes(header("[2]", "[358888888888888888888888888888888888888888888888888888888888"
                                                    "888888888888888888888888888888,8]"), data));
  check_load_fails(path, "has data_offsets [3.5888");
  for (const char* shape : {"[2.5]", "[true]", "[-2]", "[[2]]", "2"}) {
    write_bytes(path, safetensors_bytes(header(shape, "[0,8]"), data));
    check_load_fails(path, "(expected an array of non-negative integers)");
  }
  write_bytes(path, safetensors_bytes(header("[2]", "[0,8.0]"), data));
  check_load_fails(path, "(expected two non-negative integers)");
  // An empty tensor whose other sizes overflow: its strides would.
  write_bytes(path, safetensors_bytes(header("[0,1099511627776,1099511627776]", "[0,0]"), ""));
  check_load_fails(path, "whose sizes overflow 64 bits");
  // In range, the same header loads.
  write_bytes(path, safetensors_bytes(header("[1,2]", "[0,8]"), data));
  CHECK(load_safetensors(path.string()).tensors.at(0).second.shape() == Shape{1, 2});
  write_bytes(path, safetensors_bytes(header("[0,1048576,1048576]", "[0,0]"), ""));
  CHECK(load_safetensors(path.string()).tensors.at(0).second.shape() == Shape{0, 1048576, 1048576});
  fs::remove_all(folder);
}
