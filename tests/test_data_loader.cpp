// DataLoader: collation, shuffling, workers, errors from workers, clean
// shutdown mid-epoch, resumable state, pinned memory.
#include <atomic>
#include <chrono>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "data/batch_buffer.h"
#include "data/dataloader.h"
#include "data/device_prefetcher.h"
#include "data/host_batch_holder.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {

// n examples: input (1, 4, 4) float32 with every value = index + k / 100, target index.
std::shared_ptr<TensorDataset> numbered(int64_t n) {
  std::vector<float> inputs;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 16; ++k) inputs.push_back(static_cast<float>(i) + static_cast<float>(k) / 100.0f);
    targets.push_back(i);
  }
  return std::make_shared<TensorDataset>(tensor(inputs, {n, 1, 4, 4}), tensor(targets, {n}));
}

// Indices (targets) of every batch of one epoch.
std::vector<std::vector<int64_t>> epoch_targets(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  while (auto batch = loader.next()) out.push_back(batch->target.to_vector<int64_t>());
  return out;
}

struct Snapshot {
  std::vector<float> input;
  std::vector<int64_t> target;
  bool operator==(const Snapshot&) const = default;
};
std::vector<Snapshot> epoch_snapshots(DataLoader& loader) {
  std::vector<Snapshot> out;
  while (auto batch = loader.next()) out.push_back({batch->input.to_vector<float>(), batch->target.to_vector<int64_t>()});
  return out;
}

TransformList augmentation() {
  return {std::make_shared<RandomCrop>(1), std::make_shared<RandomHorizontalFlip>(0.5f),
          std::make_shared<Normalize>(std::vector<float>{5.0f}, std::vector<float>{2.0f}),
          std::make_shared<RandomErasing>(0.5f)};
}

// get_into throws at index `bad`; optionally sleeps per example.
class FaultyDataset : public Dataset {
 public:
  FaultyDataset(int64_t n, int64_t bad, int sleep_us = 0) : inner_(numbered(n)), bad_(bad), sleep_us_(sleep_us) {}
  int64_t size() const override { return inner_->size(); }
  Example get(int64_t index) const override { return inner_->get(index); }
  ExampleLayout layout() const override { return inner_->layout(); }
  void get_into(int64_t index, void* input, void* target) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    calls.fetch_add(1);
    if (index == bad_) throw std::runtime_error("disk on fire at example " + std::to_string(index));
    inner_->get_into(index, input, target);
  }
  std::string name() const override { return "FaultyDataset"; }
  mutable std::atomic<int64_t> calls{0};

 private:
  std::shared_ptr<TensorDataset> inner_;
  int64_t bad_;
  int sleep_us_;
};

}  // namespace

TEST_CASE("dataloader: sequential batches, collation and the last partial batch") {
  auto data = numbered(10);
  DataLoader loader(data, {.batch_size = 4});
  CHECK(loader.size() == 3);
  auto first = loader.next();
  REQUIRE(first.has_value());
  CHECK(first->input.shape() == Shape{4, 1, 4, 4});
  CHECK(first->input.dtype() == DType::f32);
  CHECK(first->target.shape() == Shape{4});
  CHECK(first->target.dtype() == DType::i64);
  CHECK(first->target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  auto values = first->input.to_vector<float>();
  CHECK(values[16 * 2 + 5] == doctest::Approx(2.05f));
  CHECK(loader.next()->target.to_vector<int64_t>() == std::vector<int64_t>{4, 5, 6, 7});
  auto last = loader.next();
  CHECK(last->input.shape() == Shape{2, 1, 4, 4});
  CHECK(last->target.to_vector<int64_t>() == std::vector<int64_t>{8, 9});
  CHECK(!loader.next().has_value());
  CHECK(loader.epoch() == 1);

  DataLoader dropping(data, {.batch_size = 4, .drop_last = true});
  CHECK(dropping.size() == 2);
  CHECK(epoch_targets(dropping).size() == 2);

  // Range-for runs the rest of the current epoch.
  int count = 0;
  for (Batch& batch : loader) {
    CHECK(batch.size() > 0);
    ++count;
  }
  CHECK(count == 3);
  CHECK(loader.epoch() == 2);
}

TEST_CASE("dataloader: shuffle is seeded, new each epoch, the same for the same seed and epoch") {
  auto data = numbered(50);
  DataLoader a(data, {.batch_size = 8, .shuffle = true, .seed = 11});
  DataLoader b(data, {.batch_size = 8, .shuffle = true, .seed = 11});
  DataLoader c(data, {.batch_size = 8, .shuffle = true, .seed = 12});
  auto a0 = epoch_targets(a), a1 = epoch_targets(a);
  auto b0 = epoch_targets(b);
  CHECK(a0 == b0);
  CHECK(a0 != a1);
  CHECK(a0 != epoch_targets(c));
  std::set<int64_t> seen;
  for (auto& batch : a0) seen.insert(batch.begin(), batch.end());
  CHECK(seen.size() == 50);
  // set_epoch replays an epoch.
  b.set_epoch(1);
  CHECK(epoch_targets(b) == a1);
  b.set_epoch(0);
  CHECK(epoch_targets(b) == a0);
}

TEST_CASE("dataloader: results do not depend on the number of workers (transforms included)") {
  auto data = numbered(37);
  std::vector<std::vector<Snapshot>> runs;
  for (int workers : {0, 1, 3}) {
    for (bool persistent : {false, true}) {
      DataLoader loader(data, {.batch_size = 5, .shuffle = true, .seed = 3, .num_workers = workers,
                               .prefetch_factor = 2, .persistent_workers = persistent, .transforms = augmentation()});
      auto e0 = epoch_snapshots(loader);
      auto e1 = epoch_snapshots(loader);
      CHECK(e0.size() == 8);
      CHECK(e0 != e1);
      runs.push_back(e0);
      runs.push_back(e1);
    }
  }
  for (size_t i = 2; i < runs.size(); ++i) CHECK(runs[i] == runs[i % 2]);
}

TEST_CASE("dataloader: an exception in a worker reaches the caller, never a hang") {
  for (int workers : {0, 1, 4}) {
    CAPTURE(workers);
    auto data = std::make_shared<FaultyDataset>(40, /*bad=*/13);
    DataLoader loader(data, {.batch_size = 4, .num_workers = workers});
    CHECK(loader.next()->target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(loader.next().has_value());
    CHECK(loader.next().has_value());
    // Batch 3 holds example 13.
    CHECK_THROWS_WITH_AS(loader.next(), doctest::Contains("batch 3 of epoch 0: disk on fire at example 13"), Error);
    CHECK(loader.position() == 3);
    // The loader stays at the failing batch: retrying fails the same way.
    CHECK_THROWS_WITH_AS(loader.next(), doctest::Contains("disk on fire"), Error);
    // And a fresh epoch from a good place works.
    loader.set_epoch(5);
    CHECK(loader.next()->target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  }
}

TEST_CASE("dataloader: destroying a loader mid-epoch joins its workers promptly") {
  auto data = std::make_shared<FaultyDataset>(100000, -1, /*sleep_us=*/200);
  auto start = std::chrono::steady_clock::now();
  {
    DataLoader loader(data, {.batch_size = 64, .num_workers = 4, .prefetch_factor = 4});
    CHECK(loader.next().has_value());
    CHECK(loader.next().has_value());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Two batches take about 2 * 64 * 0.2 ms / 4 workers; the in-flight work is abandoned, not finished.
  CHECK(seconds < 5.0);
  const int64_t calls = data->calls.load();
  CHECK(calls < 64 * 4 * 4 + 64 * 2 + 8);  // bounded by the prefetch window, not the data set
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(data->calls.load() == calls);  // nothing runs after destruction
}

TEST_CASE("dataloader: the caller blocks without spinning while a worker is slow") {
  auto data = std::make_shared<FaultyDataset>(64, -1, /*sleep_us=*/25000);
  DataLoader loader(data, {.batch_size = 4, .num_workers = 1, .prefetch_factor = 1});
  auto thread_cpu_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
  };
  const auto wall_start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  CHECK(loader.next().has_value());  // about 4 * 25 ms of waiting
  CHECK(loader.next().has_value());
  const double cpu = thread_cpu_seconds() - cpu_start;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  CHECK(wall > 0.15);
  CHECK_MESSAGE(cpu < 0.03, "the caller used ", cpu, " s of CPU in ", wall, " s of waiting");
}

TEST_CASE("dataloader: a state_dict taken mid-epoch resumes with exactly the same batches") {
  auto data = numbered(45);
  DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 99, .num_workers = 2,
                            .transforms = augmentation()};
  DataLoader original(data, options);
  epoch_snapshots(original);  // epoch 0
  for (int i = 0; i < 5; ++i) original.next();
  const std::string saved = original.state_dict().dump();
  auto expected = epoch_snapshots(original);
  auto expected_next_epoch = epoch_snapshots(original);
  CHECK(expected.size() == 12 - 5);

  for (int workers : {0, 3}) {
    DataLoaderOptions resumed_options = options;
    resumed_options.num_workers = workers;
    resumed_options.seed = 1234;  // the state's seed wins
    DataLoader resumed(data, resumed_options);
    resumed.next();  // whatever it was doing is dropped
    resumed.load_state_dict(nlohmann::json::parse(saved));
    CHECK(resumed.epoch() == 1);
    CHECK(resumed.position() == 5);
    CHECK(epoch_snapshots(resumed) == expected);
    CHECK(epoch_snapshots(resumed) == expected_next_epoch);
  }

  nlohmann::json state = nlohmann::json::parse(saved);
  DataLoader other_batch(data, {.batch_size = 5});
  CHECK_THROWS_WITH_AS(other_batch.load_state_dict(state),
                       doctest::Contains("saved with batch_size 4, this loader has 5"), Error);
  DataLoader other_size(numbered(44), {.batch_size = 4});
  CHECK_THROWS_WITH_AS(other_size.load_state_dict(state), doctest::Contains("saved with 45 samples per epoch"), Error);
  state["position"] = 99;
  CHECK_THROWS_WITH_AS(original.load_state_dict(state), doctest::Contains("position 99 is outside"), Error);
  CHECK_THROWS_WITH_AS(original.load_state_dict(nlohmann::json::object()), doctest::Contains("malformed state"), Error);
}

// For scripts/sanitize.sh thread: the data set is slow, so the workers are
// mid-example when the state is loaded; anything they read from the loader
// rather than from their epoch plan (the augmentation seed did) is a data race.
TEST_CASE("dataloader: load_state_dict while workers are mid-batch resumes exactly") {
  auto slow = std::make_shared<FaultyDataset>(24, /*bad=*/-1, /*sleep_us=*/3000);
  DataLoaderOptions options{.batch_size = 4, .shuffle = true, .seed = 7, .num_workers = 2,
                            .transforms = augmentation()};
  DataLoader reference(slow, options);
  reference.next();
  reference.next();
  const nlohmann::json state = reference.state_dict();
  const auto expected = epoch_snapshots(reference);
  options.seed = 8;
  DataLoader busy(slow, options);
  busy.next();  // its workers go on making the next batches, 3 ms per example
  busy.load_state_dict(state);
  CHECK(epoch_snapshots(busy) == expected);
}

TEST_CASE("dataloader: a distributed sampler drives the order") {
  auto data = numbered(10);
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto sampler = std::make_shared<DistributedSampler>(10, 2, rank, true, 5);
    DataLoader loader(data, {.batch_size = 3, .sampler = sampler});
    CHECK(loader.size() == 2);
    auto batches = epoch_targets(loader);
    for (auto& batch : batches) all.insert(all.end(), batch.begin(), batch.end());
    // The loader's epoch is the sampler's epoch.
    auto next_epoch = epoch_targets(loader);
    std::vector<int64_t> flat;
    for (auto& batch : next_epoch) flat.insert(flat.end(), batch.begin(), batch.end());
    CHECK(flat == sampler->indices(1));
  }
  std::sort(all.begin(), all.end());
  CHECK(all == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("dataloader: option errors") {
  auto data = numbered(4);
  CHECK_THROWS_WITH_AS(DataLoader(data, {.batch_size = 0}), doctest::Contains("batch_size must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(data, {.num_workers = -1}), doctest::Contains("num_workers must be >= 0"), Error);
  CHECK_THROWS_WITH_AS(DataLoader(data, {.prefetch_factor = 0}), doctest::Contains("prefetch_factor"), Error);
  auto bytes = std::make_shared<TensorDataset>(zeros({4, 2}, {.dtype = DType::u8}), zeros({4}, {.dtype = DType::i64}));
  CHECK_THROWS_WITH_AS(DataLoader(bytes, {.transforms = augmentation()}),
                       doctest::Contains("transforms need float32 inputs, TensorDataset has uint8"), Error);
  if (!cuda::is_available()) {
    CHECK_THROWS_WITH_AS(DataLoader(data, {.resident_device = Device::cuda(0)}),
                         doctest::Contains("GPU-resident mode on cuda:0: no such device"), Error);
  }
  CHECK_THROWS_WITH_AS(data->get(4), doctest::Contains("TensorDataset: example index 4 out of range [0, 4)"), Error);
}

TEST_CASE("dataloader: batch buffers are recycled, not reallocated per batch") {
  auto data = numbered(64);
  ExampleLayout layout = data->layout();
  auto pool = std::make_shared<BatchBufferPool>(layout, 8, false, 4);
  void* first_address = nullptr;
  for (int i = 0; i < 20; ++i) {
    BatchBuffer buffer = pool->acquire();
    if (i == 0) first_address = buffer.input();
    CHECK(buffer.input() == first_address);
    Batch batch = std::move(buffer).finish(8);
    CHECK(batch.input.data_ptr() == first_address);
  }
  CHECK(pool->buffers_created() == 1);
  // Held batches keep their buffers; released ones come back.
  std::vector<Batch> held;
  for (int i = 0; i < 3; ++i) held.push_back(pool->acquire().finish(8));
  CHECK(pool->buffers_created() == 3);
  held.clear();
  pool->acquire();
  CHECK(pool->buffers_created() == 3);

  // Through a loader with workers: a bounded number of buffers for a whole epoch.
  DataLoader loader(data, {.batch_size = 2, .num_workers = 2, .prefetch_factor = 2});
  CHECK(epoch_targets(loader).size() == 32);
}

TEST_CASE("dataloader: pin_memory assembles batches in pinned memory [gpu]") {
  auto data = numbered(16);
  DataLoader loader(data, {.batch_size = 4, .num_workers = 1, .pin_memory = true});
  if (!cuda::is_available()) {
    CHECK(!loader.pinned());  // ignored without a GPU, as torch does
    CHECK(!loader.next()->input.is_pinned());
  }
  KILN_REQUIRE_GPU();
  CHECK(loader.pinned());
  auto batch = loader.next();
  CHECK(batch->input.is_pinned());
  CHECK(batch->target.is_pinned());
  CHECK(cuda::is_pinned(batch->input.data_ptr()));
}

TEST_CASE("dataloader: the device prefetcher delivers the loader's batches on the GPU [gpu]") {
  auto data = numbered(23);
  DataLoader reference(data, {.batch_size = 4, .shuffle = true, .seed = 8, .transforms = augmentation()});
  auto expected = epoch_snapshots(reference);
  // cpu: a pass-through.
  DataLoader host(data, {.batch_size = 4, .shuffle = true, .seed = 8, .transforms = augmentation()});
  DevicePrefetcher passthrough(host, Device::cpu());
  std::vector<Snapshot> got;
  while (auto batch = passthrough.next()) got.push_back({batch->input.to_vector<float>(), batch->target.to_vector<int64_t>()});
  CHECK(got == expected);
  KILN_REQUIRE_GPU();
  DataLoader pinned(data, {.batch_size = 4, .shuffle = true, .seed = 8, .num_workers = 2, .pin_memory = true,
                           .transforms = augmentation()});
  DevicePrefetcher prefetcher(pinned, Device::cuda(0));
  for (int epoch = 0; epoch < 2; ++epoch) {
    got.clear();
    while (auto batch = prefetcher.next()) {
      CHECK(batch->input.is_cuda());
      got.push_back({batch->input.to_vector<float>(), batch->target.to_vector<int64_t>()});
    }
    if (epoch == 0) CHECK(got == expected);
    if (epoch == 1) CHECK(got == epoch_snapshots(reference));
  }
}

TEST_CASE("HostBatchHolder: a batch in pageable memory is dropped at once (its copies waited for themselves)") {
  std::vector<float> memory(8, 1.0f);
  bool released = false;
  Batch host{from_blob(memory.data(), {8}, DType::f32, Device::cpu(), [&](void*) { released = true; }), Tensor()};
  HostBatchHolder holder;
  holder.hold_until_done(std::move(host), 0, nullptr);
  CHECK(holder.held() == 0);
  CHECK(released);
}

namespace {
void sleep_on_stream(void* milliseconds) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(milliseconds)));
}
}  // namespace

TEST_CASE("HostBatchHolder: pinned batches copied behind a busy stream keep their bytes until the copies ran [gpu]") {
  KILN_REQUIRE_GPU();
  // The Trainer's pattern: the host runs ahead of a busy GPU, copies each
  // pinned batch non_blocking and lets the batch go; the loader's workers
  // refill a released buffer at once. Held, every copy reads its own batch.
  auto data = numbered(40);
  DataLoader reference(data, {.batch_size = 4, .shuffle = true, .seed = 3});
  const auto expected = epoch_snapshots(reference);
  DataLoader pinned(data, {.batch_size = 4, .shuffle = true, .seed = 3, .num_workers = 2, .pin_memory = true});
  const cuda::Stream stream = cuda::current_stream(0);
  static int busy_ms = 30;
  HostBatchHolder holder;
  std::vector<Batch> on_device;
  while (auto batch = pinned.next()) {
    REQUIRE(batch->input.is_pinned());
    cuda::launch_host_function(stream, sleep_on_stream, &busy_ms);  // the previous step, still running
    on_device.push_back({batch->input.to(Device::cuda(0), true), batch->target.to(Device::cuda(0), true)});
    holder.hold_until_done(std::move(*batch), 0, stream);
    CHECK(holder.held() >= 1);  // its copy waits behind the sleep
  }
  holder.release_all();
  CHECK(holder.held() == 0);
  std::vector<Snapshot> got;
  for (const Batch& b : on_device) got.push_back({b.input.to_vector<float>(), b.target.to_vector<int64_t>()});
  CHECK(got == expected);
}
