// libFuzzer target: IDX files as read_idx reads them, in memory. The first
// byte picks the role (any, images, labels); the rest is the file, gunzipped
// first when it starts with gzip's magic (read_file_bytes' rule).
#include <cstdlib>

#include "data/idx.h"
#include "tests/fuzz/fuzz_support.h"

namespace {
void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_idx: accepted a file but %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto role = static_cast<kiln::IdxRole>(data[0] % 3);
  std::vector<uint8_t> bytes(data + 1, data + size);
  const std::string name = "fuzz-input-idx3-ubyte";
  try {
    if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) bytes = kiln::gunzip(bytes, name);
    const kiln::Tensor images = kiln::parse_idx(std::move(bytes), name, role);
    check(images.is_contiguous() && images.device().is_cpu(), "the tensor is not a contiguous CPU tensor");
    if (role != kiln::IdxRole::any) {
      check(images.dtype() == kiln::DType::u8, "a role's tensor is not uint8");
      check(images.dim() == (role == kiln::IdxRole::images ? 3 : 1), "a role's tensor has the wrong rank");
    }
    // Every byte is read: ASan sees a tensor that points outside its memory.
    const auto* begin = static_cast<const uint8_t*>(images.data_ptr());
    unsigned sum = 0;
    for (size_t i = 0; i < images.nbytes(); ++i) sum += begin[i];
    volatile unsigned keep = sum;
    (void)keep;
  } catch (const kiln::Error& error) {
    kiln::fuzz::require_names_file(error, name);
  }
  return 0;
}
