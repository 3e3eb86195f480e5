// Runs selftest.cu's kernels and checks them against CUDA's semantics
// (see selftest.cu). A failure here is the emulator's.
#include "emu_test.h"
#include "emu_selftest.inc"
#include "kernels/cuda/runtime.h"

using namespace emu_test;

namespace {

void expect(bool ok, const char* what, long at) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL %s at %ld\n", what, at);
  }
}

}  // namespace

int main() {
  emu::install_fault_handler();
  // Shuffles: 2 blocks of (32, 2) threads, 4 warps.
  const int threads = 128;
  emu::Buffer<float> out(8 * threads, "shuffles");
  emu::Buffer<double> out_double(threads, "shuffles double");
  emu::Buffer<int> out_int(threads, "shuffles int");
  selftest::run_shuffles(out.data, out_double.data, out_int.data);
  long wrong = -1;
  for (int t = 0; t < threads; ++t) {
    const int lane = t % 32, warp = t - lane;
    const auto v = [&](int l) { return 100.0f * (warp + l) + 0.5f; };
    // Per the CUDA programming guide: a source lane outside the (sub)warp leaves the value unchanged.
    const float want[8] = {v(lane + 1 < 32 ? lane + 1 : lane),
                           v(lane >= 3 ? lane - 3 : lane),
                           v(lane ^ 5),
                           v(7),
                           v(lane % 8 + 2 < 8 ? lane + 2 : lane),
                           v(lane % 8 >= 1 ? lane - 1 : lane),
                           v(lane ^ 4),
                           v(lane / 8 * 8 + 9 % 8)};
    for (int k = 0; k < 8; ++k) {
      if (out[8 * t + k] != want[k] && wrong < 0) wrong = 8 * t + k;
    }
    if (out_double[t] != static_cast<double>(v(lane ^ 16)) + 0.25 && wrong < 0) wrong = 100000 + t;
    if (out_int[t] != (lane + 16 < 32 ? t + 16 : t) && wrong < 0) wrong = 200000 + t;
  }
  expect(wrong < 0, "shuffles", wrong);

  // Shared memory on a 2-D grid of 2-D blocks.
  emu::Buffer<int> in(6 * 64, "in", 0, 0), reversed(6 * 64, "reversed");
  for (int i = 0; i < 6 * 64; ++i) in[i] = i * 3;
  selftest::run_reverse(in.data, reversed.data);
  wrong = -1;
  for (int i = 0; i < 6 * 64; ++i) {
    if (reversed[i] != in[i / 64 * 64 + 63 - i % 64] && wrong < 0) wrong = i;
  }
  expect(wrong < 0, "shared memory reverse", wrong);

  // Early return with dynamic shared memory; the threads that returned leave their outputs unwritten.
  emu::Buffer<int> early(3 * 96, "early", 0, 0x7f);
  selftest::run_early_exit(40, early.data);
  wrong = -1;
  for (int i = 0; i < 3 * 96; ++i) {
    const int t = i % 96;
    if (early[i] != (t < 40 ? (39 - t) * 2 : 0x7f7f7f7f) && wrong < 0) wrong = i;
  }
  expect(wrong < 0, "early return and dynamic shared memory", wrong);

  // Atomics over 5 blocks of 256.
  emu::Buffer<float> sum(1, "sum", 0, 0);
  emu::Buffer<int> first(1, "first", 0, 0xff);
  emu::Buffer<unsigned long long> count(1, "count", 0, 0);
  selftest::run_atomics(5, sum.data, first.data, count.data);
  expect(sum[0] == 640.0f && count[0] == 1280 && first[0] == 0, "atomics", 0);

  // An invalid configuration is reported by the launch check, not run.
  selftest::run_atomics(0, sum.data, first.data, count.data);
  bool thrown = false;
  try {
    kiln::cuda::check_last_launch("zero blocks");
  } catch (const kiln::Error&) {
    thrown = true;
  }
  expect(thrown && count[0] == 1280, "invalid configuration", 0);

  std::printf("selftest: %d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks,
              emu::launches.load(), emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
