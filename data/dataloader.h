// DataLoader: batches from a Dataset, in the order of a Sampler, collated
// into tensors by C++ worker threads, with seeded shuffling, transforms,
// pinned host memory and a resumable position. torch.utils.data.DataLoader's
// options, with these differences:
//   - the loader counts epochs itself: each epoch has its own shuffled order
//     (seed + epoch, like DistributedSampler) with no set_epoch call needed;
//   - iterating (next(), or a range-for) continues the current epoch from its
//     position; set_epoch(e) starts epoch e from its first batch;
//   - state_dict() / load_state_dict() save (epoch, position, seed), so a run
//     resumed mid-epoch gets exactly the batches it would have seen.
//
// Hot path: each worker writes examples straight into a recycled batch buffer
// (pinned when pin_memory) through Dataset::get_into and transforms them in
// place; no per-example heap allocation. The calling thread blocks on a
// condition variable (never spins) until the batch it needs is ready, and
// batches arrive in order. An exception in a worker is rethrown by next() as
// a kiln::Error; destroying a loader mid-epoch stops and joins its threads.
//
// GPU-resident mode (resident_device = cuda): the whole data set (dense())
// is uploaded once; each batch is gathered, converted and augmented on the
// device by kernels on the current stream, with no host work per step.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/transforms.h"

namespace kiln {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;      // RandomSampler(seed) when no sampler is given, else SequentialSampler
  uint64_t seed = 0;         // shuffling and augmentation
  bool drop_last = false;    // drop the last batch when it is incomplete
  int num_workers = 0;       // worker threads; 0: batches are made on the calling thread
  int prefetch_factor = 2;   // batches in flight per worker
  // Keep the worker threads between epochs (and passes started by set_epoch);
  // false: each pass starts its own, as torch does.
  bool persistent_workers = false;
  bool pin_memory = false;   // assemble batches in page-locked memory (ignored without a GPU, as torch)
  TransformList transforms;  // applied in order to each float32 input
  std::shared_ptr<const Sampler> sampler;  // overrides shuffle when set
  // GPU-resident mode: the cuda device to hold the data set and make batches
  // on (num_workers and pin_memory do not apply); a cpu device means the host loader.
  std::optional<Device> resident_device;
};

class DataLoader {
 public:
  // Throws kiln::Error for invalid options (batch_size < 1, num_workers < 0,
  // prefetch_factor < 1, transforms on non-float32 inputs, resident mode
  // without dense() data or without the device). A sampler's indices are
  // checked by the data set when read (an error from next()).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();  // stops and joins the workers, mid-epoch included
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch.
  int64_t size() const;
  // The next batch of the current epoch; nullopt at the epoch's end, after
  // which the next call starts the following epoch. Rethrows a worker's (or
  // the data set's) exception as kiln::Error naming the batch and epoch; the
  // loader then stays at that batch (a later call retries it).
  std::optional<Batch> next();

  uint64_t epoch() const;
  int64_t position() const;  // batches already returned in the current epoch
  // Starts epoch `epoch` from its first batch (drops batches in flight; joins
  // the workers unless persistent_workers, so the pass starts new ones).
  void set_epoch(uint64_t epoch);
  // Makes the following epochs' batches `batch_size` examples (the trainer's
  // BatchSizeFinder); stops the workers. Throws kiln::Error for batch_size < 1
  // or while an epoch is being iterated (position() > 0): call it between epochs.
  void set_batch_size(int64_t batch_size);

  // {"epoch", "position", "seed", "batch_size", "num_samples", "sampler"}.
  nlohmann::json state_dict() const;
  // Restores a state_dict; throws kiln::Error when batch_size or the number
  // of samples per epoch differ from this loader's, or position is past the epoch.
  void load_state_dict(const nlohmann::json& state);

  const Dataset& dataset() const;
  const DataLoaderOptions& options() const;
  bool resident() const;
  // Whether batches are assembled in pinned memory.
  bool pinned() const;

  // Range-for over the rest of the current epoch.
  class Iterator {
   public:
    Iterator() = default;
    explicit Iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    bool operator==(const Iterator& other) const { return !current_ && !other.current_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  Iterator begin() { return Iterator(this); }
  Iterator end() { return Iterator(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
