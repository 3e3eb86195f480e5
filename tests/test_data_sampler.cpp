// Samplers: determinism, a new order each epoch, and DistributedSampler's
// torch semantics (padding, dropping, rank striding, coverage).
#include <algorithm>
#include <map>
#include <set>

#include "data/sampler.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {
bool is_permutation_of_range(std::vector<int64_t> order, int64_t n) {
  std::sort(order.begin(), order.end());
  for (int64_t i = 0; i < n; ++i) {
    if (order[i] != i) return false;
  }
  return static_cast<int64_t>(order.size()) == n;
}
}  // namespace

TEST_CASE("sampler: sequential order") {
  SequentialSampler sampler(5);
  CHECK(sampler.size() == 5);
  CHECK(sampler.indices(0) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(sampler.indices(7) == sampler.indices(0));
  CHECK(SequentialSampler(0).indices(0).empty());
}

TEST_CASE("sampler: random order is a permutation, seeded, new every epoch") {
  RandomSampler a(1000, 42), b(1000, 42), c(1000, 43);
  CHECK(is_permutation_of_range(a.indices(0), 1000));
  CHECK(a.indices(0) == b.indices(0));
  CHECK(a.indices(3) == b.indices(3));
  CHECK(a.indices(0) != a.indices(1));
  CHECK(a.indices(0) != c.indices(0));
  // seed + epoch, as torch's DistributedSampler.
  CHECK(a.indices(1) == c.indices(0));
  CHECK(random_permutation(1, 5) == std::vector<int64_t>{0});
  CHECK(random_permutation(0, 5).empty());
}

TEST_CASE("sampler: random permutations are uniform") {
  // All 6 orders of 3 elements over 6000 seeds: each about 1000 times.
  std::map<std::vector<int64_t>, int> counts;
  for (uint64_t seed = 0; seed < 6000; ++seed) ++counts[random_permutation(3, seed)];
  CHECK(counts.size() == 6);
  for (const auto& [order, count] : counts) CHECK_MESSAGE(std::abs(count - 1000) < 150, "count ", count);
  // Every position of a 10-permutation is equally likely for element 0.
  std::vector<int> where(10, 0);
  for (uint64_t seed = 0; seed < 5000; ++seed) {
    auto order = random_permutation(10, seed);
    ++where[std::find(order.begin(), order.end(), 0) - order.begin()];
  }
  for (int count : where) CHECK_MESSAGE(std::abs(count - 500) < 100, "count ", count);
}

TEST_CASE("sampler: distributed ranks cover every sample once when n divides evenly") {
  const int64_t n = 12, world = 3;
  for (uint64_t epoch : {0u, 1u}) {
    std::vector<int64_t> all;
    for (int64_t rank = 0; rank < world; ++rank) {
      DistributedSampler sampler(n, world, rank, /*shuffle=*/true, /*seed=*/7);
      sampler.set_epoch(epoch);
      CHECK(sampler.size() == 4);
      auto mine = sampler.indices();
      CHECK(mine.size() == 4);
      CHECK(mine == sampler.indices(epoch));
      all.insert(all.end(), mine.begin(), mine.end());
    }
    CHECK(is_permutation_of_range(all, n));
  }
  // Rank r takes positions r::world of the epoch's permutation (seed + epoch).
  auto order = random_permutation(n, 7 + 1);
  DistributedSampler rank1(n, world, 1, true, 7);
  CHECK(rank1.indices(1) == std::vector<int64_t>{order[1], order[4], order[7], order[10]});
  CHECK(rank1.indices(0) != rank1.indices(1));
}

TEST_CASE("sampler: distributed padding repeats from the start; drop_last drops the tail") {
  const int64_t n = 10, world = 4;
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < world; ++rank) {
    DistributedSampler sampler(n, world, rank, /*shuffle=*/false);
    CHECK(sampler.size() == 3);  // ceil(10 / 4)
    auto mine = sampler.indices(0);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  // Sequential order 0..9 padded with 0, 1 -> positions r::4.
  CHECK(all == std::vector<int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 0, 3, 7, 1});
  std::set<int64_t> covered(all.begin(), all.end());
  CHECK(covered.size() == 10);

  std::set<int64_t> kept;
  for (int64_t rank = 0; rank < world; ++rank) {
    DistributedSampler sampler(n, world, rank, /*shuffle=*/true, 3, /*drop_last=*/true);
    CHECK(sampler.size() == 2);
    for (int64_t i : sampler.indices(5)) CHECK(kept.insert(i).second);  // no repeats
  }
  CHECK(kept.size() == 8);

  // Padding longer than n cycles: 2 samples over 5 ranks.
  std::vector<int64_t> tiny;
  for (int64_t rank = 0; rank < 5; ++rank) {
    auto mine = DistributedSampler(2, 5, rank, false).indices(0);
    CHECK(mine.size() == 1);
    tiny.push_back(mine[0]);
  }
  CHECK(tiny == std::vector<int64_t>{0, 1, 0, 1, 0});
}

TEST_CASE("sampler: distributed argument errors") {
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 2, 2), doctest::Contains("invalid rank 2, rank should be in [0, 1]"),
                       Error);
  CHECK_THROWS_WITH_AS(DistributedSampler(10, 0, 0), doctest::Contains("world_size must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(RandomSampler(-1), doctest::Contains("negative data set size"), Error);
}
