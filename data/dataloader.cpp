// DataLoader internals. Threads: the caller and num_workers workers share one
// mutex. Workers take batch numbers in order from next_task while fewer than
// `capacity` batches are ahead of the caller, make them without the lock, and
// file each result (a batch or an exception) under its number; the caller
// waits on ready_cv for the number it needs. A job generation counter makes a
// cancelled epoch's late results fall away.
#include "data/dataloader.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/allocator.h"
#include "core/saved_json.h"
#include "data/batch_buffer.h"
#include "data/resident.h"

namespace kiln {

namespace {

// splitmix64: the augmentation seed must not reuse the sampler's Philox stream.
uint64_t mix_seed(uint64_t seed) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Everything workers read to make an epoch's batches. It is immutable once made:
// load_state_dict may change the loader's seed while a cancelled worker is
// still finishing an example of the old plan.
struct EpochPlan {
  uint64_t epoch = 0;
  uint64_t augment_seed = 0;
  std::vector<int64_t> indices;  // the sampler's order
  int64_t num_batches = 0;
};

struct Result {
  std::optional<Batch> batch;
  std::exception_ptr error;
};

struct Cancelled {};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

struct DataLoader::Impl {
  std::shared_ptr<const Dataset> dataset;
  DataLoaderOptions options;
  std::shared_ptr<const Sampler> sampler;
  bool own_sampler = false;  // made from shuffle/seed (rebuilt when a state_dict changes the seed)
  ExampleLayout layout;
  uint64_t augment_seed = 0;
  std::shared_ptr<BatchBufferPool> pool;
  std::unique_ptr<ResidentData> resident;

  uint64_t epoch = 0;
  int64_t position = 0;
  std::shared_ptr<const EpochPlan> plan;
  std::vector<float> caller_scratch;

  // Workers.
  std::mutex mutex;
  std::condition_variable work_cv, ready_cv;
  std::vector<std::thread> threads;
  bool stopping = false;
  std::atomic<uint64_t> generation{0};
  std::shared_ptr<const EpochPlan> job;  // what the workers make batches of; null when idle
  int64_t next_task = 0, consumed = 0, capacity = 0;
  std::map<int64_t, Result> ready;

  void make_sampler() {
    if (options.sampler) {
      sampler = options.sampler;
      own_sampler = false;
    } else if (options.shuffle) {
      sampler = std::make_shared<RandomSampler>(dataset->size(), options.seed);
      own_sampler = true;
    } else {
      sampler = std::make_shared<SequentialSampler>(dataset->size());
      own_sampler = true;
    }
  }

  int64_t batches_per_epoch() const {
    const int64_t n = sampler->size(), b = options.batch_size;
    // Not (n + b - 1) / b: that overflows for a batch_size near 2^63.
    return options.drop_last ? n / b : n / b + (n % b != 0);
  }

  // The most examples a batch holds: a batch_size beyond the epoch's samples (torch: one batch of
  // everything) must not size the buffers (its bytes would overflow and wrap to a small block).
  int64_t largest_batch() const { return std::max<int64_t>(1, std::min(options.batch_size, sampler->size())); }

  std::shared_ptr<const EpochPlan> make_plan(uint64_t for_epoch) const {
    auto made = std::make_shared<EpochPlan>();
    made->epoch = for_epoch;
    made->augment_seed = augment_seed;
    made->indices = sampler->indices(for_epoch);
    KILN_ASSERT(static_cast<int64_t>(made->indices.size()) == sampler->size(), sampler->name(), " returned ",
                made->indices.size(), " indices, its size() says ", sampler->size());
    made->num_batches = batches_per_epoch();
    return made;
  }

  // Makes batch `number` of `epoch_plan` on this thread. `cancelled` is polled between examples.
  template <typename CancelFn>
  Batch produce(const EpochPlan& epoch_plan, int64_t number, std::vector<float>& scratch, CancelFn cancelled) {
    const int64_t start = number * options.batch_size;
    const int64_t count = std::min<int64_t>(options.batch_size, static_cast<int64_t>(epoch_plan.indices.size()) - start);
    BatchBuffer buffer = pool->acquire();  // returned to the pool if we throw
    auto* input = static_cast<char*>(buffer.input());
    auto* target = static_cast<char*>(buffer.target());
    const size_t input_bytes = layout.input.nbytes(), target_bytes = layout.target.nbytes();
    for (int64_t row = 0; row < count; ++row) {
      if (cancelled()) throw Cancelled{};
      const int64_t index = epoch_plan.indices[start + row];
      dataset->get_into(index, input + row * input_bytes, target + row * target_bytes);
      if (!options.transforms.empty()) {
        apply_transforms(options.transforms, reinterpret_cast<float*>(input + row * input_bytes), layout.input.shape,
                         epoch_plan.augment_seed, epoch_plan.epoch, index, scratch.data());
      }
    }
    return std::move(buffer).finish(count);
  }

  // ------------------------------------------------------------ workers

  void worker_loop() {
    std::vector<float> scratch(static_cast<size_t>(std::max<int64_t>(layout.input.numel(), 1)));
    std::unique_lock lock(mutex);
    for (;;) {
      work_cv.wait(lock, [&] {
        return stopping || (job && next_task < job->num_batches && next_task < consumed + capacity);
      });
      if (stopping) return;
      std::shared_ptr<const EpochPlan> task_plan = job;
      const int64_t task = next_task++;
      const uint64_t task_generation = generation.load();
      lock.unlock();
      Result result;
      try {
        result.batch = produce(*task_plan, task, scratch,
                               [&] { return generation.load(std::memory_order_relaxed) != task_generation; });
      } catch (const Cancelled&) {
      } catch (...) {
        result.error = std::current_exception();
      }
      lock.lock();
      if (generation.load() != task_generation) continue;  // the job was replaced: drop the result
      ready.emplace(task, std::move(result));
      ready_cv.notify_all();
    }
  }

  void start_threads() {
    if (!threads.empty()) return;
    {
      std::lock_guard lock(mutex);
      stopping = false;
    }
    threads.reserve(options.num_workers);
    for (int i = 0; i < options.num_workers; ++i) threads.emplace_back([this] { worker_loop(); });
  }

  void stop_threads() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
      generation.fetch_add(1);
      job.reset();
      ready.clear();
    }
    work_cv.notify_all();
    for (std::thread& thread : threads) thread.join();
    threads.clear();
  }

  // Drops the workers' job and their results (they finish the example at hand and idle).
  void cancel_job() {
    std::lock_guard lock(mutex);
    generation.fetch_add(1);
    job.reset();
    ready.clear();
  }

  Batch next_from_workers() {
    start_threads();
    std::unique_lock lock(mutex);
    if (job != plan || consumed != position) {
      // New epoch, or a restart after an error, set_epoch or load_state_dict.
      generation.fetch_add(1);
      job = plan;
      ready.clear();
      next_task = consumed = position;
      work_cv.notify_all();
    }
    ready_cv.wait(lock, [&] { return ready.count(position) > 0; });
    auto node = ready.extract(position);
    consumed = position + 1;
    work_cv.notify_all();
    if (node.mapped().error) {
      // Stop this job; the next call restarts at this batch.
      generation.fetch_add(1);
      job.reset();
      ready.clear();
      std::exception_ptr error = node.mapped().error;
      lock.unlock();
      KILN_THROW("DataLoader: a worker failed to make batch ", position, " of epoch ", epoch, ": ", describe(error));
    }
    return std::move(*node.mapped().batch);
  }

  std::optional<Batch> next() {
    if (!plan || plan->epoch != epoch) {
      plan = make_plan(epoch);
      if (resident) resident->set_order(plan->indices);
    }
    if (position >= plan->num_batches) {
      // End of the epoch: the next call starts the following one.
      ++epoch;
      position = 0;
      plan.reset();
      if (!options.persistent_workers && !threads.empty()) stop_threads();
      return std::nullopt;
    }
    Batch batch;
    if (resident) {
      const int64_t start = position * options.batch_size;
      batch = resident->batch(plan->epoch, start,
                              std::min<int64_t>(options.batch_size, static_cast<int64_t>(plan->indices.size()) - start));
    } else if (options.num_workers == 0) {
      try {
        batch = produce(*plan, position, caller_scratch, [] { return false; });
      } catch (...) {
        KILN_THROW("DataLoader: failed to make batch ", position, " of epoch ", epoch, ": ",
                   describe(std::current_exception()));
      }
    } else {
      batch = next_from_workers();
    }
    ++position;
    return batch;
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  KILN_CHECK(dataset != nullptr, "DataLoader: null data set");
  KILN_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be at least 1, got ", options.batch_size);
  KILN_CHECK(options.num_workers >= 0, "DataLoader: num_workers must be >= 0, got ", options.num_workers);
  KILN_CHECK(options.prefetch_factor >= 1, "DataLoader: prefetch_factor must be at least 1, got ",
             options.prefetch_factor);
  d.dataset = std::move(dataset);
  d.options = std::move(options);
  d.layout = d.dataset->layout();
  KILN_CHECK(d.options.transforms.empty() || d.layout.input.dtype == DType::f32, "DataLoader: transforms need float32 inputs, ",
             d.dataset->name(), " has ", dtype_name(d.layout.input.dtype), " ", shape_str(d.layout.input.shape));
  for (const auto& transform : d.options.transforms) {
    KILN_CHECK(transform != nullptr, "DataLoader: null transform in the transform list");
  }
  d.make_sampler();
  d.augment_seed = mix_seed(d.options.seed);
  d.capacity = static_cast<int64_t>(d.options.num_workers) * d.options.prefetch_factor;
  d.caller_scratch.resize(static_cast<size_t>(std::max<int64_t>(d.layout.input.numel(), 1)));
  if (d.options.resident_device && d.options.resident_device->is_cuda()) {
    d.resident = std::make_unique<ResidentData>(*d.dataset, d.layout, *d.options.resident_device,
                                                d.largest_batch(), d.options.transforms, d.augment_seed);
  } else {
    const bool pin = d.options.pin_memory && cuda::is_available();
    d.pool = std::make_shared<BatchBufferPool>(d.layout, d.largest_batch(), pin, static_cast<size_t>(d.capacity + 2));
  }
}

DataLoader::~DataLoader() {
  if (impl_) impl_->stop_threads();
}

int64_t DataLoader::size() const { return impl_->batches_per_epoch(); }
std::optional<Batch> DataLoader::next() { return impl_->next(); }
uint64_t DataLoader::epoch() const { return impl_->epoch; }
int64_t DataLoader::position() const { return impl_->position; }
const Dataset& DataLoader::dataset() const { return *impl_->dataset; }
const DataLoaderOptions& DataLoader::options() const { return impl_->options; }
bool DataLoader::resident() const { return impl_->resident != nullptr; }
bool DataLoader::pinned() const { return impl_->pool && impl_->pool->pinned(); }

void DataLoader::set_epoch(uint64_t epoch) {
  // As torch, where each pass (a new iterator) starts its workers unless they
  // persist: a pass that never read past its last batch (the Trainer stops at
  // its batch limit) must not hand its threads to the next one.
  if (impl_->options.persistent_workers) {
    impl_->cancel_job();
  } else {
    impl_->stop_threads();
  }
  impl_->epoch = epoch;
  impl_->position = 0;
  impl_->plan.reset();
}

void DataLoader::set_batch_size(int64_t batch_size) {
  Impl& d = *impl_;
  KILN_CHECK(batch_size >= 1, "DataLoader::set_batch_size: batch_size must be at least 1, got ", batch_size);
  KILN_CHECK(d.position == 0, "DataLoader::set_batch_size: epoch ", d.epoch, " is being iterated (", d.position,
             " batches returned); change the batch size before an epoch's first batch (or after set_epoch)");
  if (batch_size == d.options.batch_size) return;
  d.stop_threads();  // no worker fills a buffer of the old size any more
  d.options.batch_size = batch_size;
  d.plan.reset();
  if (d.resident) {
    d.resident.reset();  // free the old upload before making the new one
    d.resident = std::make_unique<ResidentData>(*d.dataset, d.layout, *d.options.resident_device,
                                                d.largest_batch(), d.options.transforms, d.augment_seed);
  } else {
    // Batches already handed out keep the old pool alive until they are gone.
    d.pool = std::make_shared<BatchBufferPool>(d.layout, d.largest_batch(), d.pool->pinned(),
                                               static_cast<size_t>(d.capacity + 2));
  }
}

nlohmann::json DataLoader::state_dict() const {
  const Impl& d = *impl_;
  return nlohmann::json{{"epoch", d.epoch},
                        {"position", d.position},
                        {"seed", d.options.seed},
                        {"batch_size", d.options.batch_size},
                        {"num_samples", d.sampler->size()},
                        {"sampler", d.sampler->name()}};
}

void DataLoader::load_state_dict(const nlohmann::json& state) {
  Impl& d = *impl_;
  // Everything is read and checked before anything changes. Integers only:
  // get<> would truncate a float position and wrap a negative epoch or seed around.
  constexpr std::string_view where = "DataLoader::load_state_dict: malformed state";
  const uint64_t epoch = saved_json::unsigned_integer_at(state, "epoch", where);
  const uint64_t seed = saved_json::unsigned_integer_at(state, "seed", where);
  const int64_t position = saved_json::integer_at(state, "position", where, 0);
  const int64_t batch_size = saved_json::integer_at(state, "batch_size", where, 1);
  const int64_t num_samples = saved_json::integer_at(state, "num_samples", where, 0);
  KILN_CHECK(batch_size == d.options.batch_size, "DataLoader::load_state_dict: the state was saved with batch_size ",
             batch_size, ", this loader has ", d.options.batch_size);
  KILN_CHECK(num_samples == d.sampler->size(), "DataLoader::load_state_dict: the state was saved with ", num_samples,
             " samples per epoch, this loader has ", d.sampler->size());
  // The number of batches depends on the batch size and the sample count (just checked), not on the seed.
  KILN_CHECK(position <= d.batches_per_epoch(), "DataLoader::load_state_dict: position ", position,
             " is outside the epoch's ", d.batches_per_epoch(), " batches");
  d.cancel_job();
  d.options.seed = seed;
  d.augment_seed = mix_seed(seed);
  if (d.resident) d.resident->set_seed(d.augment_seed);
  if (d.own_sampler) d.make_sampler();
  d.epoch = epoch;
  d.position = position;
  d.plan.reset();
}

}  // namespace kiln
