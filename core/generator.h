// Seeded counter-based random numbers (Philox4x32-10). Element i of a draw of
// n values uses counter (offset + i / 4), lane i % 4, so the same seed gives
// the same numbers on CPU and CUDA whatever the launch configuration.
#pragma once

#include <cstdint>
#include <mutex>

#include "core/device.h"

namespace kiln {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in 128-bit Philox counters consumed
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  GeneratorState state() const;
  void set_state(const GeneratorState& state);
  // Reserves `counters` 128-bit counters and returns the state to draw them from.
  GeneratorState advance(uint64_t counters);

 private:
  mutable std::mutex mutex_;
  GeneratorState state_;
};

// The default generator of a device (one for cpu, one per cuda device).
Generator& default_generator(Device device);
// Seeds the default generators of every device (torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace kiln
