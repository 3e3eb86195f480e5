#include "core/generator.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace kiln {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard lock(mutex_);
  state_ = {seed, 0};
}

bool Generator::in_graph_locked() const {
  return graph_replay_ != nullptr && std::this_thread::get_id() == graph_thread_;
}

GeneratorState Generator::state() const {
  std::lock_guard lock(mutex_);
  if (in_graph_locked()) return {state_.seed, graph_counters_, graph_replay_};
  return state_;
}

void Generator::set_state(const GeneratorState& state) {
  std::lock_guard lock(mutex_);
  if (in_graph_locked()) {
    KILN_CHECK(state.replay == graph_replay_, "Generator::set_state: a state from outside the CUDA graph being "
               "captured cannot be set inside its capture (the graph's draws are relative to its replay state)");
    graph_counters_ = state.offset;
    return;
  }
  KILN_CHECK(state.replay == nullptr, "Generator::set_state: a state saved inside a CUDA graph's capture cannot be "
             "set outside it (its offset is relative to that graph's replays)");
  state_ = state;
}

GeneratorState Generator::advance(uint64_t counters) {
  std::lock_guard lock(mutex_);
  if (in_graph_locked()) {
    const GeneratorState drawn{state_.seed, graph_counters_, graph_replay_};
    graph_counters_ += counters;
    graph_counters_reached_ = std::max(graph_counters_reached_, graph_counters_);
    return drawn;
  }
  GeneratorState drawn = state_;
  state_.offset += counters;
  return drawn;
}

void Generator::begin_graph(const philox::ReplayState* replay) {
  std::lock_guard lock(mutex_);
  graph_replay_ = replay;
  graph_thread_ = std::this_thread::get_id();
  graph_counters_ = 0;
  graph_counters_reached_ = 0;
}

uint64_t Generator::end_graph() {
  std::lock_guard lock(mutex_);
  graph_replay_ = nullptr;
  return graph_counters_reached_;
}

namespace {
struct Generators {
  Generator cpu;
  std::vector<std::unique_ptr<Generator>> cuda;
  std::mutex mutex;
};
Generators& generators() {
  static auto* all = new Generators();  // leaked: used from static destructors
  return *all;
}
}  // namespace

Generator& default_generator(Device device) {
  Generators& all = generators();
  if (device.is_cpu()) return all.cpu;
  std::lock_guard lock(all.mutex);
  if (all.cuda.size() <= static_cast<size_t>(device.index)) all.cuda.resize(device.index + 1);
  auto& slot = all.cuda[device.index];
  if (!slot) slot = std::make_unique<Generator>(all.cpu.state().seed);
  return *slot;
}

void manual_seed(uint64_t seed) {
  Generators& all = generators();
  all.cpu.manual_seed(seed);
  std::lock_guard lock(all.mutex);
  for (auto& generator : all.cuda) {
    if (generator) generator->manual_seed(seed);
  }
  // Devices not yet touched take the CPU seed on first use.
}

}  // namespace kiln
