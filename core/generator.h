// Seeded counter-based random numbers (Philox4x32-10). Element i of a draw of
// n values uses counter (offset + i / 4), lane i % 4, so the same seed gives
// the same numbers on CPU and CUDA whatever the launch configuration.
#pragma once

#include <cstdint>
#include <mutex>
#include <thread>

#include "core/device.h"
#include "kernels/philox.h"

namespace kiln {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in 128-bit Philox counters consumed
  // Set while a CUDA graph records: the kernels read the seed and base offset
  // there at every replay, and `offset` is relative to it (kernels/philox.h).
  const philox::ReplayState* replay = nullptr;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : state_{seed, 0} {}
  void manual_seed(uint64_t seed);
  // Inside a graph's capture (on the capturing thread) the state is the
  // graph's: offset relative to its replay state, `replay` set. A state set
  // there must come from the same capture (activation checkpointing replays
  // its forward's draws in the backward), and one from a capture cannot be set
  // outside it; either throws kiln::Error.
  GeneratorState state() const;
  void set_state(const GeneratorState& state);
  // Reserves `counters` 128-bit counters and returns the state to draw them from.
  GeneratorState advance(uint64_t counters);
  // While the calling thread records a CUDA graph on this (CUDA) generator's
  // device: its draws are counted from 0 relative to `replay`, and the host
  // state does not move (other threads draw from the host state as before);
  // end_graph returns how many counters one replay consumes (the most any
  // draw reached, also when set_state went back to repeat draws).
  void begin_graph(const philox::ReplayState* replay);
  uint64_t end_graph();

 private:
  bool in_graph_locked() const;

  mutable std::mutex mutex_;
  GeneratorState state_;
  const philox::ReplayState* graph_replay_ = nullptr;
  std::thread::id graph_thread_;
  uint64_t graph_counters_ = 0, graph_counters_reached_ = 0;
};

// The default generator of a device (one for cpu, one per cuda device).
Generator& default_generator(Device device);
// Seeds the default generators of every device (torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace kiln
