// libFuzzer target: load_safetensors on the input, written to a file.
#include "core/serialization.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::fuzz::InputFile input("weights.safetensors");
  const std::string& path = input.path;
  kiln::fuzz::write_file(path, data, size);
  try {
    const kiln::SafetensorsFile file = kiln::load_safetensors(path);
    // Every element is read as its dtype (a converting copy): ASan and UBSan
    // see values or sizes a tensor cannot hold.
    for (const auto& [name, tensor] : file.tensors) {
      const kiln::Tensor values = tensor.to(kiln::DType::f64);
      volatile double keep = values.numel() > 0 ? values.data<double>()[values.numel() - 1] : 0.0;
      (void)keep;
    }
  } catch (const kiln::Error& error) {
    kiln::fuzz::require_names_file(error, path);
  }
  return 0;
}
