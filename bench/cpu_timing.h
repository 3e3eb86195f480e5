// Timing for the CPU kernel benches that report CPU time beside wall time
// (bench_conv, bench_resnet9_conv): on a busy machine wall time includes
// waiting for a core, process CPU time does not.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <random>
#include <vector>

namespace kiln::bench {

inline double process_cpu_seconds() {
  timespec now;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Medians of wall time and of process CPU time (all threads).
struct Timing {
  double wall, cpu;
};
inline Timing median_time(const std::function<void()>& fn, int repeats) {
  fn();  // warm-up: thread-local workspaces, page faults
  std::vector<double> walls, cpus;
  for (int i = 0; i < repeats; ++i) {
    const double cpu_start = process_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    fn();
    walls.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    cpus.push_back(process_cpu_seconds() - cpu_start);
  }
  std::sort(walls.begin(), walls.end());
  std::sort(cpus.begin(), cpus.end());
  return {walls[walls.size() / 2], cpus[cpus.size() / 2]};
}

// `count` draws of N(0, 1) from a seeded engine.
inline std::vector<float> random_floats(size_t count, uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& v : values) v = normal(engine);
  return values;
}

}  // namespace kiln::bench
