#include "core/device.h"

#include <charconv>

#include "kernels/error.h"

namespace kiln {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  for (std::string_view prefix : {"cuda:", "gpu:"}) {
    if (text.substr(0, prefix.size()) == prefix) {
      std::string_view digits = text.substr(prefix.size());
      int index = -1;
      auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (error == std::errc() && end == digits.data() + digits.size() && index >= 0) return cuda(index);
    }
  }
  KILN_THROW("Device: cannot parse '", text, "' (expected cpu, cuda or cuda:N)");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace kiln
