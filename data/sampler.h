// Samplers: the order in which a DataLoader visits a data set in one epoch.
// A sampler is a pure function of the epoch, so a run resumed mid-epoch sees
// the same order again with nothing but (seed, epoch) saved.
//
// Shuffled orders follow torch's DistributedSampler: the permutation of an
// epoch is drawn from a generator seeded with seed + epoch (here Philox, so
// the numbers differ from torch's while the semantics match).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Number of indices per epoch.
  virtual int64_t size() const = 0;
  // The indices of epoch `epoch`, each in [0, dataset size).
  virtual std::vector<int64_t> indices(uint64_t epoch) const = 0;
  virtual std::string name() const = 0;
};

// A uniformly random permutation of [0, n) determined by `seed` (Fisher-Yates
// over Philox draws; the same on every machine).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed);

// 0, 1, ..., n - 1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;
  std::string name() const override { return "SequentialSampler"; }

 private:
  int64_t n_;
};

// random_permutation(n, seed + epoch): a new order every epoch, the same order
// for the same seed and epoch.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;
  std::string name() const override { return "RandomSampler"; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// torch.utils.data.DistributedSampler: the epoch's order (shuffled with
// seed + epoch, or sequential), padded by repeating indices from its start up
// to a multiple of world_size (or, with drop_last, cut down to one), then rank
// r takes positions r, r + world_size, .... Every rank gets the same count.
class DistributedSampler : public Sampler {
 public:
  // Throws kiln::Error unless 0 <= rank < world_size.
  DistributedSampler(int64_t n, int64_t world_size, int64_t rank, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices(uint64_t epoch) const override;
  std::string name() const override { return "DistributedSampler"; }
  // torch's set_epoch: the epoch that indices() without argument uses. A
  // DataLoader passes its own epoch instead and needs no call.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }
  std::vector<int64_t> indices() const { return indices(epoch_); }
  int64_t total_size() const { return num_samples_ * world_size_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_size_; }

 private:
  int64_t n_, world_size_, rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
  uint64_t epoch_ = 0;
};

}  // namespace kiln
