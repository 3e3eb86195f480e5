// Transforms: CPU results against direct definitions, seeded randomness that
// depends only on (seed, epoch, index), and CUDA-vs-CPU parity (GPU).
#include <cmath>
#include <set>

#include "data/dataloader.h"
#include "data/transforms.h"
#include "tests/support/test_util.h"

using namespace kiln;

namespace {

constexpr int64_t C = 2, H = 5, W = 6, N = C * H * W;

std::vector<float> ramp() {
  std::vector<float> x(N);
  for (int64_t i = 0; i < N; ++i) x[i] = static_cast<float>(i) + 1.0f;
  return x;
}

kernels::AugmentKey key(int64_t index, uint64_t epoch = 0, uint64_t seed = 17, uint32_t slot = 0) {
  return {seed, epoch, index, slot};
}

std::vector<float> run(const Transform& transform, std::vector<float> x, const kernels::AugmentKey& k) {
  std::vector<float> scratch(N);
  transform.apply(x.data(), {C, H, W}, k, scratch.data());
  return x;
}

}  // namespace

TEST_CASE("transforms: Normalize per channel, and fit on a data set") {
  Normalize normalize({1.0f, 2.0f}, {2.0f, 4.0f});
  auto out = run(normalize, ramp(), key(0));
  for (int64_t i = 0; i < N; ++i) {
    const float mean = i < H * W ? 1.0f : 2.0f, stddev = i < H * W ? 2.0f : 4.0f;
    CHECK(out[i] == doctest::Approx((static_cast<float>(i) + 1.0f - mean) / stddev));
  }
  CHECK_THROWS_WITH_AS(Normalize({1.0f}, {0.0f}), doctest::Contains("every std must be positive"), Error);
  CHECK_THROWS_WITH_AS(Normalize({1.0f}, {1.0f, 2.0f}), doctest::Contains("same nonzero length"), Error);
  std::vector<float> sample(N), scratch(N);
  CHECK_THROWS_WITH_AS(Normalize({0.0f}, {1.0f}).apply(sample.data(), {C, H, W}, key(0), scratch.data()),
                       doctest::Contains("1 channel statistics for a sample of shape [2, 5, 6]"), Error);

  // Channel 0 holds 0..9 per example, channel 1 holds 5.
  std::vector<float> inputs;
  for (int example = 0; example < 3; ++example) {
    for (int k = 0; k < 10; ++k) inputs.push_back(static_cast<float>(k));
    for (int k = 0; k < 10; ++k) inputs.push_back(5.0f + (k % 2 ? 1.0f : -1.0f));
  }
  TensorDataset data(tensor(inputs, {3, 2, 2, 5}), zeros({3}, {.dtype = DType::i64}));
  auto fitted = Normalize::fit(data);
  CHECK(fitted->mean()[0] == doctest::Approx(4.5));
  CHECK(fitted->std()[0] == doctest::Approx(std::sqrt(8.25)));
  CHECK(fitted->mean()[1] == doctest::Approx(5.0));
  CHECK(fitted->std()[1] == doctest::Approx(1.0));
}

TEST_CASE("transforms: RandomCrop pads with fill and shifts by the drawn offset") {
  RandomCrop crop(2, -7.0f);
  const auto x = ramp();
  std::set<std::pair<int64_t, int64_t>> offsets;
  for (int64_t index = 0; index < 200; ++index) {
    auto out = run(crop, x, key(index));
    const kernels::CropOffset offset = kernels::crop_offset(key(index), 2);
    CHECK(offset.top >= 0);
    CHECK(offset.top <= 4);
    CHECK(offset.left <= 4);
    offsets.insert({offset.top, offset.left});
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t y = 0; y < H; ++y) {
        for (int64_t xx = 0; xx < W; ++xx) {
          const int64_t sy = y + offset.top - 2, sx = xx + offset.left - 2;
          const float expected = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? x[(c * H + sy) * W + sx] : -7.0f;
          CHECK(out[(c * H + y) * W + xx] == expected);
        }
      }
    }
  }
  CHECK(offsets.size() == 25);  // every offset in [0, 4]^2 occurs
  CHECK(run(RandomCrop(0), x, key(3)) == x);
  CHECK_THROWS_WITH_AS(RandomCrop(-1), doctest::Contains("padding must be >= 0"), Error);
}

TEST_CASE("transforms: RandomHorizontalFlip mirrors with probability p") {
  const auto x = ramp();
  auto flipped = run(RandomHorizontalFlip(1.0f), x, key(0));
  for (int64_t row = 0; row < C * H; ++row) {
    for (int64_t i = 0; i < W; ++i) CHECK(flipped[row * W + i] == x[row * W + W - 1 - i]);
  }
  CHECK(run(RandomHorizontalFlip(0.0f), x, key(0)) == x);
  int count = 0;
  for (int64_t index = 0; index < 2000; ++index) count += run(RandomHorizontalFlip(0.5f), x, key(index)) != x;
  CHECK(std::abs(count - 1000) < 120);
}

TEST_CASE("transforms: RandomErasing sets one box to the value") {
  const auto x = ramp();
  RandomErasing always(1.0f, 0.1f, 0.3f, 0.5f, 2.0f, -1.0f);
  int erased_samples = 0;
  for (int64_t index = 0; index < 300; ++index) {
    auto out = run(always, x, key(index));
    const kernels::ErasingBox box = kernels::erasing_box(key(index), H, W, kernels::ErasingParams{
        1.0f, 0.1f, 0.3f, std::log(0.5f), std::log(2.0f), -1.0f});
    if (box.height == 0) {
      CHECK(out == x);
      continue;
    }
    ++erased_samples;
    CHECK(box.top + box.height <= H);
    CHECK(box.left + box.width <= W);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t y = 0; y < H; ++y) {
        for (int64_t xx = 0; xx < W; ++xx) {
          const bool inside = y >= box.top && y < box.top + box.height && xx >= box.left && xx < box.left + box.width;
          CHECK(out[(c * H + y) * W + xx] == (inside ? -1.0f : x[(c * H + y) * W + xx]));
        }
      }
    }
  }
  CHECK(erased_samples > 200);  // most draws find a box that fits
  CHECK(run(RandomErasing(0.0f), x, key(1)) == x);
  CHECK_THROWS_WITH_AS(RandomErasing(0.5f, 0.5f, 0.2f), doctest::Contains("scale_low <= scale_high"), Error);
}

TEST_CASE("transforms: randomness depends on (seed, epoch, index, slot) only") {
  const auto x = ramp();
  TransformList list{std::make_shared<RandomCrop>(2), std::make_shared<RandomHorizontalFlip>(),
                     std::make_shared<RandomErasing>()};
  auto apply_list = [&](uint64_t seed, uint64_t epoch, int64_t index) {
    std::vector<float> sample = x, scratch(N);
    apply_transforms(list, sample.data(), {C, H, W}, seed, epoch, index, scratch.data());
    return sample;
  };
  CHECK(apply_list(1, 0, 5) == apply_list(1, 0, 5));
  int differ_epoch = 0, differ_seed = 0, differ_index = 0;
  for (int64_t index = 0; index < 50; ++index) {
    differ_epoch += apply_list(1, 0, index) != apply_list(1, 1, index);
    differ_seed += apply_list(1, 0, index) != apply_list(2, 0, index);
    differ_index += apply_list(1, 0, index) != apply_list(1, 0, index + 50);
  }
  CHECK(differ_epoch > 40);
  CHECK(differ_seed > 40);
  CHECK(differ_index > 40);
  // Slots draw independent words: flip decisions of slots 0 and 1 disagree about half the time.
  int disagree = 0;
  for (int64_t index = 0; index < 1000; ++index) {
    disagree += kernels::flip_decision(key(index, 0, 1, 0), 0.5f) != kernels::flip_decision(key(index, 0, 1, 1), 0.5f);
  }
  CHECK(std::abs(disagree - 500) < 80);
}

TEST_CASE("transforms: CUDA kernels equal the CPU kernels [gpu]") {
  KILN_REQUIRE_GPU();
  const int64_t B = 9;
  TransformList list{std::make_shared<RandomCrop>(3), std::make_shared<RandomHorizontalFlip>(),
                     std::make_shared<Normalize>(std::vector<float>{0.5f, 1.5f}, std::vector<float>{2.0f, 3.0f}),
                     std::make_shared<RandomErasing>(0.7f)};
  std::vector<float> host(B * N);
  for (int64_t i = 0; i < B * N; ++i) host[i] = std::sin(static_cast<float>(i));
  std::vector<int64_t> indices{4, 100, 7, 7, 0, 123456789, 5, 6, 99};
  // CPU, sample by sample.
  std::vector<float> expected = host, scratch(N);
  for (int64_t b = 0; b < B; ++b) {
    apply_transforms(list, expected.data() + b * N, {C, H, W}, 77, 3, indices[b], scratch.data());
  }
  Tensor batch = tensor(host, {B, C, H, W}).cuda();
  Tensor device_indices = tensor(indices, {B}).cuda();
  Tensor device_scratch = empty({B, C, H, W}, {.device = Device::cuda(0)});
  apply_transforms_cuda(list, batch.data<float>(), batch.shape(), device_indices.data<int64_t>(), 77, 3,
                        device_scratch.data<float>(), cuda::current_stream(0));
  KILN_CHECK_CLOSE(batch.cpu(), tensor(expected, {B, C, H, W}), 1e-6, 1e-6);
}

TEST_CASE("transforms: GPU-resident loading equals the host loader [gpu]") {
  KILN_REQUIRE_GPU();
  std::vector<float> inputs;
  std::vector<int64_t> targets;
  for (int64_t i = 0; i < 50; ++i) {
    for (int64_t k = 0; k < N; ++k) inputs.push_back(std::cos(static_cast<float>(i * N + k)));
    targets.push_back(i % 7);
  }
  auto data = std::make_shared<TensorDataset>(tensor(inputs, {50, C, H, W}), tensor(targets, {50}));
  TransformList list{std::make_shared<RandomCrop>(1), std::make_shared<RandomHorizontalFlip>(),
                     std::make_shared<Normalize>(std::vector<float>{0.1f, 0.2f}, std::vector<float>{0.9f, 1.1f}),
                     std::make_shared<RandomErasing>()};
  DataLoader host(data, {.batch_size = 8, .shuffle = true, .seed = 5, .num_workers = 2, .transforms = list});
  DataLoader resident(data, {.batch_size = 8, .shuffle = true, .seed = 5, .transforms = list,
                             .resident_device = Device::cuda(0)});
  CHECK(resident.resident());
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (auto expected = host.next()) {
      auto got = resident.next();
      REQUIRE(got.has_value());
      CHECK(got->input.is_cuda());
      KILN_CHECK_CLOSE(got->input.cpu(), expected->input, 1e-6, 1e-6);
      CHECK(got->target.to_vector<int64_t>() == expected->target.to_vector<int64_t>());
    }
    CHECK(!resident.next().has_value());
  }
}
