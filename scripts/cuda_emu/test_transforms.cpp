// transforms.cu (random_crop_kernel, horizontal_flip_kernel, normalize_kernel,
// random_erasing_kernel, gather_rows_kernel: the GPU-resident loader's
// per-batch augmentation) through random_crop_cuda, horizontal_flip_cuda,
// normalize_cuda, random_erasing_cuda and gather_rows_cuda, emulated, against
// kernels/cpu/transforms.cpp (linked by run_kernels.sh) sample by sample, bit
// for bit: both draw from transforms.h's shared Philox decisions keyed by
// (seed, epoch, data set index, slot), so row b of the batch must equal the CPU
// kernel on sample indices[b]. gather_rows against its contract (dst row b =
// src row indices[b] converted, float32 times `scale` as MnistFamily::get_into
// computes it), every source/destination dtype pair and the rejected ones.
// Then whole pipelines: test_data_transforms' [gpu] parity case (crop 3, flip,
// normalize, erasing 0.7 at slots 0-3, repeated and large indices) and a
// Fashion-MNIST batch (uint8 rows gathered with scale 1/255, crop 2, flip,
// normalize). Scratch and destination buffers start as 0xff bytes (NaN);
// buffers sit between guard pages. Each case prints how many samples the
// random decisions touched (so that a case that never crops or flips shows).
// Shapes: odd and even widths, width 1, 1x1 images, padding 0 and larger
// than the image, 28x28 and 32x32 (erasing boxes larger than a block).
//   test_transforms   (no arguments)
#include "emu_test.h"
#include "emu_transforms.inc"

#include <chrono>
#include <cstring>
#include <numeric>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

struct Image {
  int64_t batch, channels, height, width;
  int64_t sample() const { return channels * height * width; }
  int64_t numel() const { return batch * sample(); }
};

// got == want byte for byte (count elements of T).
template <typename T>
void same_bits(const std::string& label, const T* got, const T* want, int64_t count) {
  ++checks;
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < count; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(T)) != 0) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL %s: %ld of %ld differ; first at %ld: %.9g vs %.9g\n", label.c_str(), bad, count, first,
                static_cast<double>(got[first]), static_cast<double>(want[first]));
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

void fill_batch(emu::Buffer<float>& batch, uint64_t salt) {
  for (size_t i = 0; i < batch.n; ++i) batch[i] = std::sin(static_cast<float>(i) + static_cast<float>(salt) * 0.37f);
}

void set_indices(emu::Buffer<int64_t>& indices, const std::vector<int64_t>& values) {
  for (size_t i = 0; i < values.size(); ++i) indices[i] = values[i];
}

// B data set indices: out of order, with repeats, one large.
std::vector<int64_t> make_indices(int64_t count, uint64_t salt) {
  std::vector<int64_t> v(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) v[b] = (b * 37 + static_cast<int64_t>(salt) * 11) % 101;
  if (count > 2) v[1] = v[2];
  if (count > 3) v[3] = 123456789012;
  return v;
}

void done(const std::string& label, const char* touched, int64_t count, int64_t of,
          std::chrono::steady_clock::time_point start) {
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %-62s %s %ld of %ld samples (%.2f s)\n", label.c_str(), touched, count, of, seconds);
  std::fflush(stdout);
}

void crop_case(const Image& im, int64_t padding, float fill, uint64_t seed, uint64_t epoch, uint32_t slot) {
  const auto start = std::chrono::steady_clock::now();
  emu::Buffer<float> batch(im.numel(), "batch", 0, 0), scratch(im.numel(), "scratch");
  emu::Buffer<int64_t> indices(im.batch, "indices", 0, 0);
  const std::vector<int64_t> index = make_indices(im.batch, seed + padding);
  set_indices(indices, index);
  fill_batch(batch, padding);
  std::vector<float> want(batch.data, batch.data + im.numel()), cpu_scratch(im.sample());
  int64_t moved = 0;
  for (int64_t b = 0; b < im.batch; ++b) {
    const AugmentKey key{seed, epoch, index[b], slot};
    random_crop_cpu(want.data() + b * im.sample(), im.channels, im.height, im.width, padding, fill, key,
                    cpu_scratch.data());
    const CropOffset offset = padding > 0 ? crop_offset(key, padding) : CropOffset{0, 0};
    moved += offset.top != padding || offset.left != padding;
  }
  random_crop_cuda(batch.data, scratch.data, im.batch, im.channels, im.height, im.width, padding, fill, indices.data,
                   seed, epoch, slot, nullptr);
  char label[160];
  std::snprintf(label, sizeof label, "crop (%ld, %ld, %ld, %ld) padding %ld fill %g", im.batch, im.channels,
                im.height, im.width, padding, fill);
  same_bits(label, batch.data, want.data(), im.numel());
  done(label, "shifted", moved, im.batch, start);
}

void flip_case(const Image& im, float p, uint64_t seed, uint64_t epoch, uint32_t slot) {
  const auto start = std::chrono::steady_clock::now();
  emu::Buffer<float> batch(im.numel(), "batch", 0, 0);
  emu::Buffer<int64_t> indices(im.batch, "indices", 0, 0);
  const std::vector<int64_t> index = make_indices(im.batch, seed);
  set_indices(indices, index);
  fill_batch(batch, 3);
  std::vector<float> want(batch.data, batch.data + im.numel());
  int64_t flipped = 0;
  for (int64_t b = 0; b < im.batch; ++b) {
    const AugmentKey key{seed, epoch, index[b], slot};
    horizontal_flip_cpu(want.data() + b * im.sample(), im.channels, im.height, im.width, p, key);
    flipped += flip_decision(key, p);
  }
  horizontal_flip_cuda(batch.data, im.batch, im.channels, im.height, im.width, p, indices.data, seed, epoch, slot,
                       nullptr);
  char label[160];
  std::snprintf(label, sizeof label, "flip (%ld, %ld, %ld, %ld) p %g", im.batch, im.channels, im.height, im.width, p);
  same_bits(label, batch.data, want.data(), im.numel());
  done(label, "flipped", flipped, im.batch, start);
}

void normalize_case(const Image& im) {
  const auto start = std::chrono::steady_clock::now();
  emu::Buffer<float> batch(im.numel(), "batch", 0, 0);
  fill_batch(batch, 5);
  NormalizeParams params;
  params.channels = static_cast<int>(im.channels);
  std::vector<float> mean(im.channels), inv_std(im.channels);
  for (int64_t c = 0; c < im.channels; ++c) {
    mean[c] = params.mean[c] = 0.1f * static_cast<float>(c) - 0.3f;
    inv_std[c] = params.inv_std[c] = 1.0f / (0.25f + 0.5f * static_cast<float>(c));  // as Normalize computes it
  }
  std::vector<float> want(batch.data, batch.data + im.numel());
  for (int64_t b = 0; b < im.batch; ++b) {
    normalize_cpu(want.data() + b * im.sample(), im.channels, im.height * im.width, mean.data(), inv_std.data());
  }
  normalize_cuda(batch.data, im.batch, im.height * im.width, params, nullptr);
  char label[160];
  std::snprintf(label, sizeof label, "normalize (%ld, %ld, %ld, %ld)", im.batch, im.channels, im.height, im.width);
  same_bits(label, batch.data, want.data(), im.numel());
  done(label, "all", im.batch, im.batch, start);
}

void erasing_case(const Image& im, const ErasingParams& params, uint64_t seed, uint64_t epoch, uint32_t slot) {
  const auto start = std::chrono::steady_clock::now();
  emu::Buffer<float> batch(im.numel(), "batch", 0, 0);
  emu::Buffer<int64_t> indices(im.batch, "indices", 0, 0);
  const std::vector<int64_t> index = make_indices(im.batch, seed + 1);
  set_indices(indices, index);
  fill_batch(batch, 7);
  std::vector<float> want(batch.data, batch.data + im.numel());
  int64_t erased = 0, largest = 0;
  for (int64_t b = 0; b < im.batch; ++b) {
    const AugmentKey key{seed, epoch, index[b], slot};
    random_erasing_cpu(want.data() + b * im.sample(), im.channels, im.height, im.width, params, key);
    const ErasingBox box = erasing_box(key, im.height, im.width, params);
    erased += box.height > 0;
    largest = std::max(largest, im.channels * box.height * box.width);
  }
  random_erasing_cuda(batch.data, im.batch, im.channels, im.height, im.width, params, indices.data, seed, epoch, slot,
                      nullptr);
  char label[160];
  std::snprintf(label, sizeof label, "erasing (%ld, %ld, %ld, %ld) p %g scale [%g, %g] value %g (box <= %ld)",
                im.batch, im.channels, im.height, im.width, params.p, params.scale_low, params.scale_high,
                params.value, largest);
  same_bits(label, batch.data, want.data(), im.numel());
  done(label, "erased", erased, im.batch, start);
}

// ---------------------------------------------------------------- gather_rows

template <typename T>
T source_value(int64_t i) {
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<uint8_t>((i * 97 + 13) % 256);
  if constexpr (std::is_same_v<T, float>) return static_cast<float>((i * 7919) % 2001 - 1000) * 0.25f;
  if constexpr (std::is_same_v<T, int32_t>) return static_cast<int32_t>((i * 7919) % 200001 - 100000);
  return static_cast<int64_t>((i * 7919) % 200001 - 100000) * 1000003;  // int64 beyond 2^32
}

template <typename Src, typename Dst>
void gather_case(DType src_dtype, DType dst_dtype, int64_t row_numel, float scale) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = 23, count = 9;
  emu::Buffer<Src> src(rows * row_numel, "src", 0, 0);
  for (int64_t i = 0; i < rows * row_numel; ++i) src[i] = source_value<Src>(i);
  const std::vector<int64_t> index = {22, 0, 5, 5, 17, 1, 22, 9, 3};
  emu::Buffer<int64_t> indices(count, "indices", 0, 0);
  set_indices(indices, index);
  emu::Buffer<Dst> dst(count * row_numel, "dst");
  gather_rows_cuda(src.data, src_dtype, row_numel, indices.data, count, dst.data, dst_dtype, scale, nullptr);
  std::vector<Dst> want(count * row_numel);
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t j = 0; j < row_numel; ++j) {
      const Src value = src[index[b] * row_numel + j];
      if constexpr (std::is_same_v<Dst, float>) {
        want[b * row_numel + j] = static_cast<float>(value) * scale;
      } else {
        want[b * row_numel + j] = static_cast<Dst>(value);
      }
    }
  }
  char label[160];
  std::snprintf(label, sizeof label, "gather_rows %s -> %s rows of %ld scale %g", std::string(dtype_name(src_dtype)).c_str(),
                std::string(dtype_name(dst_dtype)).c_str(), row_numel, scale);
  same_bits(label, dst.data, want.data(), count * row_numel);
  done(label, "rows", count, count, start);
}

template <typename Src>
void gather_all(DType src_dtype) {
  for (int64_t row_numel : {1, 7, 784}) {
    gather_case<Src, float>(src_dtype, DType::f32, row_numel, 1.0f);
    gather_case<Src, float>(src_dtype, DType::f32, row_numel, 1.0f / 255.0f);
    gather_case<Src, int32_t>(src_dtype, DType::i32, row_numel, 1.0f);
    gather_case<Src, int64_t>(src_dtype, DType::i64, row_numel, 1.0f);
  }
}

void gather_rejects() {
  emu::Buffer<float> src(8, "src", 0, 0), dst(8, "dst");
  emu::Buffer<int64_t> indices(2, "indices", 0, 0);
  set_indices(indices, {0, 1});
  const auto throws = [&](DType s, DType d, const char* what) {
    ++checks;
    try {
      gather_rows_cuda(src.data, s, 4, indices.data, 2, dst.data, d, 1.0f, nullptr);
    } catch (const Error& e) {
      if (std::strstr(e.what(), what) != nullptr) return;
    }
    ++failures;
    std::printf("FAIL gather_rows %s -> %s: no kiln::Error naming '%s'\n", std::string(dtype_name(s)).c_str(),
                std::string(dtype_name(d)).c_str(), what);
  };
  throws(DType::f16, DType::f32, "unsupported source dtype");
  throws(DType::f64, DType::f32, "unsupported source dtype");
  throws(DType::f32, DType::f64, "unsupported destination dtype");
  throws(DType::u8, DType::bf16, "unsupported destination dtype");
  std::printf("done gather_rows rejects f16/f64 sources and f64/bf16 destinations\n");
}

void normalize_rejects() {
  emu::Buffer<float> batch(4, "batch", 0, 0);
  for (int channels : {0, 17}) {
    ++checks;
    NormalizeParams params;
    params.channels = channels;
    bool thrown = false;
    try {
      normalize_cuda(batch.data, 1, 1, params, nullptr);
    } catch (const Error&) {
      thrown = true;
    }
    if (!thrown) {
      ++failures;
      std::printf("FAIL normalize_cuda with %d channels: no kiln::Error\n", channels);
    }
  }
  std::printf("done normalize_cuda rejects 0 and 17 channels\n");
}

// ---------------------------------------------------------------- pipelines

// test_data_transforms' "[gpu] CUDA kernels equal the CPU kernels": RandomCrop(3), RandomHorizontalFlip,
// Normalize({0.5, 1.5}, {2, 3}), RandomErasing(0.7) at slots 0-3, seed 77, epoch 3.
void parity_pipeline() {
  const auto start = std::chrono::steady_clock::now();
  const Image im{9, 2, 5, 6};
  const std::vector<int64_t> index{4, 100, 7, 7, 0, 123456789, 5, 6, 99};
  const uint64_t seed = 77, epoch = 3;
  emu::Buffer<float> batch(im.numel(), "batch", 0, 0), scratch(im.numel(), "scratch");
  emu::Buffer<int64_t> indices(im.batch, "indices", 0, 0);
  set_indices(indices, index);
  for (int64_t i = 0; i < im.numel(); ++i) batch[i] = std::sin(static_cast<float>(i));
  NormalizeParams params;
  params.channels = 2;
  const float mean[2] = {0.5f, 1.5f}, inv_std[2] = {1.0f / 2.0f, 1.0f / 3.0f};
  for (int c = 0; c < 2; ++c) {
    params.mean[c] = mean[c];
    params.inv_std[c] = inv_std[c];
  }
  ErasingParams erasing;
  erasing.p = 0.7f;
  erasing.log_ratio_low = std::log(0.3f);
  erasing.log_ratio_high = std::log(3.3f);
  std::vector<float> want(batch.data, batch.data + im.numel()), cpu_scratch(im.sample());
  for (int64_t b = 0; b < im.batch; ++b) {
    float* sample = want.data() + b * im.sample();
    random_crop_cpu(sample, 2, 5, 6, 3, 0.0f, {seed, epoch, index[b], 0}, cpu_scratch.data());
    horizontal_flip_cpu(sample, 2, 5, 6, 0.5f, {seed, epoch, index[b], 1});
    normalize_cpu(sample, 2, 30, mean, inv_std);
    random_erasing_cpu(sample, 2, 5, 6, erasing, {seed, epoch, index[b], 3});
  }
  random_crop_cuda(batch.data, scratch.data, 9, 2, 5, 6, 3, 0.0f, indices.data, seed, epoch, 0, nullptr);
  horizontal_flip_cuda(batch.data, 9, 2, 5, 6, 0.5f, indices.data, seed, epoch, 1, nullptr);
  normalize_cuda(batch.data, 9, 30, params, nullptr);
  random_erasing_cuda(batch.data, 9, 2, 5, 6, erasing, indices.data, seed, epoch, 3, nullptr);
  same_bits("pipeline test_data_transforms [gpu] parity", batch.data, want.data(), im.numel());
  done("pipeline test_data_transforms [gpu] parity (crop 3, flip, normalize, erasing 0.7)", "", im.batch, im.batch,
       start);
}

// A Fashion-MNIST batch: uint8 images gathered with scale 1/255, RandomCrop(2), flip, Normalize.
void fashion_pipeline() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t images = 60, pixels = 28 * 28, B = 16;
  const uint64_t seed = 0x9E3779B97F4A7C15ull, epoch = 5;
  emu::Buffer<uint8_t> dataset(images * pixels, "dataset", 0, 0);
  for (int64_t i = 0; i < images * pixels; ++i) dataset[i] = static_cast<uint8_t>((i * 2654435761ull >> 7) % 256);
  std::vector<int64_t> order(images);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(11));
  emu::Buffer<int64_t> rows(B, "rows", 0, 0);
  set_indices(rows, std::vector<int64_t>(order.begin() + 20, order.begin() + 20 + B));
  emu::Buffer<float> batch(B * pixels, "batch"), scratch(B * pixels, "scratch");
  const float scale = 1.0f / 255.0f;
  gather_rows_cuda(dataset.data, DType::u8, pixels, rows.data, B, batch.data, DType::f32, scale, nullptr);
  NormalizeParams params;
  params.channels = 1;
  params.mean[0] = 0.2860f;
  params.inv_std[0] = 1.0f / 0.3530f;
  random_crop_cuda(batch.data, scratch.data, B, 1, 28, 28, 2, 0.0f, rows.data, seed, epoch, 0, nullptr);
  horizontal_flip_cuda(batch.data, B, 1, 28, 28, 0.5f, rows.data, seed, epoch, 1, nullptr);
  normalize_cuda(batch.data, B, pixels, params, nullptr);
  std::vector<float> want(B * pixels), cpu_scratch(pixels);
  for (int64_t b = 0; b < B; ++b) {
    float* sample = want.data() + b * pixels;
    for (int64_t k = 0; k < pixels; ++k) sample[k] = static_cast<float>(dataset[rows[b] * pixels + k]) * scale;
    random_crop_cpu(sample, 1, 28, 28, 2, 0.0f, {seed, epoch, rows[b], 0}, cpu_scratch.data());
    horizontal_flip_cpu(sample, 1, 28, 28, 0.5f, {seed, epoch, rows[b], 1});
    normalize_cpu(sample, 1, pixels, params.mean, params.inv_std);
  }
  same_bits("pipeline fashion-mnist", batch.data, want.data(), B * pixels);
  done("pipeline fashion-mnist (gather u8 / 255, crop 2, flip, normalize)", "", B, B, start);
}

}  // namespace

int main() {
  emu::install_fault_handler();
  const uint64_t seed = 17, big_seed = 0xD1B54A32D192ED03ull;
  for (int64_t padding : {1, 2, 3}) crop_case({9, 2, 5, 6}, padding, -7.0f, seed, 0, 0);
  crop_case({9, 2, 5, 6}, 0, -7.0f, seed, 0, 0);        // no padding: a no-op
  crop_case({5, 2, 3, 7}, 9, 0.5f, big_seed, 4, 2);     // padding beyond the image: mostly fill
  crop_case({6, 3, 1, 1}, 1, -1.0f, seed, 1, 1);        // 1x1 images
  crop_case({4, 1, 28, 28}, 2, 0.0f, big_seed, 7, 0);   // Fashion-MNIST
  crop_case({4, 3, 32, 32}, 4, 0.0f, seed, 3, 5);       // CIFAR-like
  for (float p : {0.5f, 1.0f, 0.0f}) flip_case({9, 2, 5, 6}, p, seed, 0, 1);
  flip_case({12, 3, 4, 7}, 0.5f, big_seed, 3, 0);       // odd width: the middle column stays
  flip_case({5, 2, 3, 1}, 1.0f, seed, 0, 0);            // width 1: nothing to swap
  flip_case({8, 1, 28, 28}, 0.5f, seed, 9, 2);
  normalize_case({4, 1, 28, 28});
  normalize_case({9, 2, 5, 6});
  normalize_case({7, 3, 1, 1});
  normalize_case({3, 16, 1, 5});
  normalize_rejects();
  ErasingParams defaults;
  defaults.log_ratio_low = std::log(0.3f);
  defaults.log_ratio_high = std::log(3.3f);
  erasing_case({40, 2, 5, 6}, defaults, seed, 0, 3);
  ErasingParams always{1.0f, 0.1f, 0.3f, std::log(0.5f), std::log(2.0f), -1.0f};
  erasing_case({40, 2, 5, 6}, always, big_seed, 2, 0);
  ErasingParams large{1.0f, 0.3f, 0.6f, std::log(0.5f), std::log(2.0f), 2.5f};
  erasing_case({6, 1, 28, 28}, large, seed, 1, 2);
  erasing_case({3, 3, 32, 32}, large, big_seed, 6, 4);  // boxes of up to 3 x 600 elements: many per thread
  ErasingParams rarely{1.0f, 0.95f, 1.0f, std::log(0.3f), std::log(3.3f), 9.0f};
  erasing_case({20, 1, 5, 6}, rarely, seed, 0, 0);      // most draws do not fit: no box after 10 attempts
  gather_all<uint8_t>(DType::u8);
  gather_all<int32_t>(DType::i32);
  gather_all<int64_t>(DType::i64);
  gather_all<float>(DType::f32);
  gather_rejects();
  parity_pipeline();
  fashion_pipeline();
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
