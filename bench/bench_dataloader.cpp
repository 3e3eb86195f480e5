// DataLoader throughput (samples/s) on Fashion-MNIST train (60000 examples,
// synthetic data of the same shape when the data set is not installed) with
// augmentation that costs what real training uses: random crop (padding 4) +
// horizontal flip + normalize. Host loader with 0, 1, 2 workers; the host
// loader feeding the GPU through the DevicePrefetcher; GPU-resident mode.
// GPU lines print "skipped" without a GPU.
//
//   bench_dataloader [--epochs N] [--batch-size B]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "data/dataloader.h"
#include "data/device_prefetcher.h"
#include "data/fashion_mnist.h"
#include "kernels/cuda/runtime.h"

using namespace kiln;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::shared_ptr<const Dataset> load_data(std::string* source) {
  if (std::filesystem::exists(std::string(FashionMNIST::default_root) + "/train-images-idx3-ubyte.gz") ||
      std::filesystem::exists(std::string(FashionMNIST::default_root) + "/train-images-idx3-ubyte")) {
    *source = "Fashion-MNIST train";
    return std::make_shared<FashionMNIST>();
  }
  *source = "synthetic (Fashion-MNIST not installed)";
  std::vector<float> inputs(60000 * 784);
  std::vector<int64_t> targets(60000);
  for (size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<float>((i * 2654435761u) % 256) / 255.0f;
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<int64_t>(i % 10);
  return std::make_shared<TensorDataset>(tensor(inputs, {60000, 1, 28, 28}), tensor(targets, {60000}));
}

// Samples per second over `epochs` full epochs after a one-batch warm-up.
template <typename NextFn, typename SyncFn>
double measure(NextFn next, SyncFn sync, int epochs, int64_t* samples_out) {
  next();  // warm-up: starts the workers, faults in the buffers
  auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  for (int epoch = 0; epoch < epochs;) {
    auto batch = next();
    if (!batch) {
      ++epoch;
      continue;
    }
    samples += batch->size();
  }
  sync();
  *samples_out = samples;
  return static_cast<double>(samples) / seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = 2;
  int64_t batch_size = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--epochs") == 0) epochs = std::stoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--batch-size") == 0) batch_size = std::stoll(argv[i + 1]);
  }
  std::string source;
  auto load_start = std::chrono::steady_clock::now();
  auto data = load_data(&source);
  const double load_seconds = seconds_since(load_start);
  auto normalize = std::make_shared<Normalize>(std::vector<float>{0.2860f}, std::vector<float>{0.3530f});
  TransformList augmentation{std::make_shared<RandomCrop>(4), std::make_shared<RandomHorizontalFlip>(), normalize};

  std::printf("bench_dataloader: %s, %lld examples, batch %lld, %d epochs, crop(4)+flip+normalize\n", source.c_str(),
              static_cast<long long>(data->size()), static_cast<long long>(batch_size), epochs);
  std::printf("data set load (decode or map the shared cache): %.3f s; hardware threads: %u\n", load_seconds,
              std::thread::hardware_concurrency());
  std::printf("%-44s %14s %10s\n", "mode", "samples/s", "samples");

  const bool gpu = cuda::is_available();
  for (int workers : {0, 1, 2}) {
    DataLoader loader(data, {.batch_size = batch_size, .shuffle = true, .seed = 1, .num_workers = workers,
                             .persistent_workers = true, .pin_memory = gpu, .transforms = augmentation});
    int64_t samples = 0;
    const double rate = measure([&] { return loader.next(); }, [] {}, epochs, &samples);
    std::printf("host loader, num_workers=%d%-18s %14.0f %10lld\n", workers, gpu ? " (pinned)" : "", rate,
                static_cast<long long>(samples));
  }
  {
    DataLoader loader(data, {.batch_size = batch_size, .shuffle = true, .seed = 1, .num_workers = 2});
    int64_t samples = 0;
    const double rate = measure([&] { return loader.next(); }, [] {}, epochs, &samples);
    std::printf("%-44s %14.0f %10lld\n", "host loader, num_workers=2, no transforms", rate,
                static_cast<long long>(samples));
  }
  if (!gpu) {
    std::printf("%-44s %14s\n", "host loader + DevicePrefetcher -> cuda:0", "skipped (no GPU)");
    std::printf("%-44s %14s\n", "GPU-resident (cuda:0)", "skipped (no GPU)");
    return 0;
  }
  {
    DataLoader loader(data, {.batch_size = batch_size, .shuffle = true, .seed = 1, .num_workers = 2,
                             .persistent_workers = true, .pin_memory = true, .transforms = augmentation});
    DevicePrefetcher prefetcher(loader, Device::cuda(0));
    int64_t samples = 0;
    const double rate = measure([&] { return prefetcher.next(); }, [] { cuda::device_synchronize(0); }, epochs,
                                &samples);
    std::printf("%-44s %14.0f %10lld\n", "host loader (2 workers) + DevicePrefetcher", rate,
                static_cast<long long>(samples));
  }
  {
    DataLoader loader(data, {.batch_size = batch_size, .shuffle = true, .seed = 1, .transforms = augmentation,
                             .resident_device = Device::cuda(0)});
    int64_t samples = 0;
    const double rate = measure([&] { return loader.next(); }, [] { cuda::device_synchronize(0); }, epochs, &samples);
    std::printf("%-44s %14.0f %10lld\n", "GPU-resident (cuda:0)", rate, static_cast<long long>(samples));
  }
  return 0;
}
