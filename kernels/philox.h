// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// usable on host and device. Counter-based: the numbers depend only on
// (seed, counter), never on the order of evaluation.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace kiln::philox {

struct Uint4 {
  uint32_t x, y, z, w;
};

KILN_HOST_DEVICE inline uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* high) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *high = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

// Four 32-bit random words for the 128-bit `counter` under the 64-bit `seed`.
KILN_HOST_DEVICE inline Uint4 philox4x32(uint64_t seed, uint64_t counter_low, uint64_t counter_high = 0) {
  Uint4 c{static_cast<uint32_t>(counter_low), static_cast<uint32_t>(counter_low >> 32),
          static_cast<uint32_t>(counter_high), static_cast<uint32_t>(counter_high >> 32)};
  uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t high0, high1;
    uint32_t low0 = mulhilo(0xD2511F53u, c.x, &high0);
    uint32_t low1 = mulhilo(0xCD9E8D57u, c.z, &high1);
    c = Uint4{high1 ^ c.y ^ key0, low1, high0 ^ c.w ^ key1, low0};
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  return c;
}

// The seed and base offset a CUDA graph's random kernels read at every
// replay (core/cuda_graph.h writes them before each launch), so that a
// replayed dropout draws new numbers: such a kernel's own `offset` is then
// relative to `offset` here, and its own `seed` is ignored.
struct ReplayState {
  uint64_t seed;
  uint64_t offset;
};
KILN_HOST_DEVICE inline uint64_t seed_of(uint64_t seed, const ReplayState* replay) {
  return replay != nullptr ? replay->seed : seed;
}
KILN_HOST_DEVICE inline uint64_t offset_of(uint64_t offset, const ReplayState* replay) {
  return replay != nullptr ? replay->offset + offset : offset;
}

KILN_HOST_DEVICE inline uint32_t lane(const Uint4& words, int index) {
  return index == 0 ? words.x : index == 1 ? words.y : index == 2 ? words.z : words.w;
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
KILN_HOST_DEVICE inline float uniform_float(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}
// Uniform in [0, 1) with 53 random bits from two words.
KILN_HOST_DEVICE inline double uniform_double(uint32_t high, uint32_t low) {
  uint64_t bits = (static_cast<uint64_t>(high) << 21) ^ (low >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// Element i of a draw: the word for lane i % 4 of counter (offset + i / 4).
KILN_HOST_DEVICE inline uint32_t word_at(uint64_t seed, uint64_t offset, uint64_t index) {
  Uint4 words = philox4x32(seed, offset + index / 4);
  return lane(words, static_cast<int>(index % 4));
}

}  // namespace kiln::philox
