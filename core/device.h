// Where a tensor lives: cpu, or cuda:N.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

namespace kiln {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  // Parses "cpu", "cuda", "cuda:1", "gpu"; throws kiln::Error otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  bool operator==(const Device&) const = default;
};

inline std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

}  // namespace kiln
