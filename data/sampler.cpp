#include "data/sampler.h"

#include <numeric>

#include "kernels/error.h"
#include "kernels/philox.h"

namespace kiln {

namespace {
__extension__ typedef unsigned __int128 Uint128;  // GCC/Clang; __extension__ keeps -Wpedantic quiet
}  // namespace

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed) {
  KILN_CHECK(n >= 0, "random_permutation: negative size ", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Fisher-Yates from the end; step i draws 64 bits (two Philox lanes of
  // counter i / 2) and maps them to [0, i] by a 128-bit multiply (bias < 2^-40).
  philox::Uint4 words{};
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t counter = static_cast<uint64_t>(i) / 2;
    if (i == n - 1 || (i & 1) == 1) words = philox::philox4x32(seed, counter);
    const bool high_pair = (i & 1) == 1;
    const uint64_t bits = high_pair ? (static_cast<uint64_t>(words.z) << 32 | words.w)
                                    : (static_cast<uint64_t>(words.x) << 32 | words.y);
    const auto j = static_cast<int64_t>((static_cast<Uint128>(bits) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(order[i], order[j]);
  }
  return order;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  KILN_CHECK(n >= 0, "SequentialSampler: negative data set size ", n);
}

std::vector<int64_t> SequentialSampler::indices(uint64_t) const {
  std::vector<int64_t> order(static_cast<size_t>(n_));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  KILN_CHECK(n >= 0, "RandomSampler: negative data set size ", n);
}

std::vector<int64_t> RandomSampler::indices(uint64_t epoch) const { return random_permutation(n_, seed_ + epoch); }

DistributedSampler::DistributedSampler(int64_t n, int64_t world_size, int64_t rank, bool shuffle, uint64_t seed,
                                       bool drop_last)
    : n_(n), world_size_(world_size), rank_(rank), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  KILN_CHECK(n >= 0, "DistributedSampler: negative data set size ", n);
  KILN_CHECK(world_size >= 1, "DistributedSampler: world_size must be at least 1, got ", world_size);
  KILN_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: invalid rank ", rank, ", rank should be in [0, ",
             world_size - 1, "]");
  // As torch: with drop_last the tail that cannot be split evenly is dropped,
  // else the order is padded up to the next multiple of world_size.
  num_samples_ = drop_last_ ? n_ / world_size_ : (n_ + world_size_ - 1) / world_size_;
}

std::vector<int64_t> DistributedSampler::indices(uint64_t epoch) const {
  std::vector<int64_t> order = shuffle_ ? random_permutation(n_, seed_ + epoch) : SequentialSampler(n_).indices(0);
  const int64_t total = total_size();
  if (static_cast<int64_t>(order.size()) < total) {
    // Pad by repeating from the start (cycling when the padding exceeds n).
    const int64_t original = static_cast<int64_t>(order.size());
    KILN_ASSERT(original > 0, "DistributedSampler: padding an empty order");
    for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) order.push_back(order[i % original]);
  } else {
    order.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t i = rank_; i < total; i += world_size_) mine.push_back(order[i]);
  return mine;
}

}  // namespace kiln
