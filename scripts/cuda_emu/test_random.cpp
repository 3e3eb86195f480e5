// random.cu emulated against kernels/cpu/random.cpp (linked by run_kernels.sh),
// bit for bit: dropout_kernel through dropout_cuda (out and mask), and
// dropout_backward_kernel through dropout_backward_cuda (dx), for float32,
// float64, float16, bfloat16; counts 1, 3, 4, 5, 1023, 4097 (whole quads and
// tails); bases aligned for whole-quad accesses or moved off by one element /
// a mask byte / half a quad (the scalar fallback), x and out aliased; mask
// present and absent; nonzero seed and offset, directly or through a
// philox::ReplayState (graph replay). Then uniform/normal/randint (several
// dtypes, with and without ReplayState) against uniform_cpu/normal_cpu/
// randint_cpu. Outputs start as 0xff bytes (NaN), so an element left unwritten
// shows; buffers sit between guard pages. The dropout buffers are 32-byte
// aligned (a float64 quad) before their offset.
//   test_random [count]   (one count only)
#include "emu_test.h"
#include "emu_random.inc"

#include <chrono>

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;

namespace {

int path_checks = 0;  // cases whose quads flag was checked against quad_aligned (absent before the quad path)

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, Half>) return "f16";
  if constexpr (std::is_same_v<T, BFloat16>) return "bf16";
  if constexpr (std::is_same_v<T, float>) return "f32";
  return "f64";
}

template <typename T>
DType type_dtype() {
  if constexpr (std::is_same_v<T, Half>) return DType::f16;
  if constexpr (std::is_same_v<T, BFloat16>) return DType::bf16;
  if constexpr (std::is_same_v<T, float>) return DType::f32;
  return DType::f64;
}

// Elements whose bytes differ; the first one's index in *first.
long count_differ(const void* a, const void* b, size_t count, size_t size, long* first) {
  long wrong = 0;
  *first = -1;
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const char*>(a) + i * size, static_cast<const char*>(b) + i * size, size) != 0) {
      if (wrong++ == 0) *first = static_cast<long>(i);
    }
  }
  return wrong;
}

template <typename T>
double as_double(T v) {
  return static_cast<double>(static_cast<compute_t<T>>(v));
}

// Byte offsets of x (or dout), out (or dx) and the mask from their 32-byte-aligned bases.
struct Offsets {
  size_t x, out, mask;
  bool alias;  // out == x (dx == dout)
  const char* name;
};

template <typename T>
std::vector<Offsets> offsets_for() {
  const size_t e = sizeof(T);
  return {
      {0, 0, 0, false, "aligned"},
      {e, 0, 0, false, "x+1 elem"},
      {0, e, 0, false, "out+1 elem"},
      {0, 0, 1, false, "mask+1 byte"},
      {0, 0, 2, false, "mask+2 bytes"},
      {e, e, 0, false, "x,out+1 elem"},
      {8, 8, 0, false, "x,out+8 bytes"},     // 16-bit: quads (8-byte), not 16-byte aligned; wider: scalar
      {16, 16, 4, false, "x,out+16 mask+4"},  // f16/bf16/f32: quads; f64: 16 mod 32, scalar
      {0, 0, 0, true, "in place"},
      {e, e, 0, true, "in place +1 elem"},
  };
}

template <typename T>
void dropout_case(int64_t count, const Offsets& off, bool with_mask, bool replayed, float p) {
  const auto start = std::chrono::steady_clock::now();
  const DType dtype = type_dtype<T>();
  const uint64_t seed = 0x243F6A8885A308D3ull, offset = 12345;
  const philox::ReplayState state{0x13198A2E03707344ull, 777};
  const double scale = p < 1 ? 1.0 / (1.0 - p) : 0.0;
  std::mt19937_64 engine(static_cast<uint64_t>(count * 131 + off.x * 7 + off.out * 3 + off.mask + sizeof(T)));
  std::normal_distribution<double> normal;

  emu::Buffer<T> x(count, "x", off.x, 0, 32);
  std::vector<T> x_host(count);
  for (int64_t i = 0; i < count; ++i) {
    double v = 3.0 * normal(engine);
    if (i % 97 == 5) v = INFINITY;
    if (i % 89 == 7) v = -0.0;
    x_host[i] = T(static_cast<compute_t<T>>(v));
    x[i] = x_host[i];
  }
  std::unique_ptr<emu::Buffer<T>> out_buffer;
  if (!off.alias) out_buffer = std::make_unique<emu::Buffer<T>>(count, "out", off.out, 0xff, 32);
  T* out = off.alias ? x.data : out_buffer->data;
  emu::Buffer<uint8_t> mask(with_mask ? count : 0, "mask", off.mask, 0xff, 32);
  emu::Buffer<philox::ReplayState> replay(1, "replay", 0, 0);
  replay[0] = state;

  dropout_cuda(x.data, out, with_mask ? mask.data : nullptr, dtype, count, p, scale, seed, offset, nullptr,
               replayed ? replay.data : nullptr);

  std::vector<T> want(count);
  std::vector<uint8_t> want_mask(count, 0xee);
  dropout_cpu(x_host.data(), want.data(), want_mask.data(), dtype, count, p, scale, replayed ? state.seed : seed,
              replayed ? state.offset + offset : offset);

  const bool quads_expected = off.x % (4 * sizeof(T)) == 0 && (off.alias || off.out % (4 * sizeof(T)) == 0) &&
                              (!with_mask || off.mask % 4 == 0);
  bool ok = true;
  char label[200];
  std::snprintf(label, sizeof label, "dropout %-4s n %5ld %-16s %-7s %-6s p %.2f  %s", type_name<T>(),
                static_cast<long>(count), off.name, with_mask ? "mask" : "no mask", replayed ? "replay" : "", p,
                quads_expected ? "quads" : "scalar");
  if constexpr (requires { quad_aligned<T>(x.data, out, mask.data); }) {
    ++path_checks;
    const bool chosen = quad_aligned<T>(x.data, out, with_mask ? mask.data : nullptr);
    if (chosen != quads_expected) {
      ok = false;
      std::printf("FAIL %s: quad_aligned chose %d\n", label, chosen);
    }
  }
  long first = -1;
  const long wrong = count_differ(out, want.data(), count, sizeof(T), &first);
  if (wrong != 0) {
    ok = false;
    std::printf("FAIL %s: out: %ld of %ld differ, first at %ld: %.9g vs %.9g (x %.9g)\n", label, wrong,
                static_cast<long>(count), first, as_double(out[first]), as_double(want[first]), as_double(x_host[first]));
  }
  if (with_mask) {
    const long wrong_mask = count_differ(mask.data, want_mask.data(), count, 1, &first);
    if (wrong_mask != 0) {
      ok = false;
      std::printf("FAIL %s: mask: %ld of %ld differ, first at %ld: %d vs %d\n", label, wrong_mask,
                  static_cast<long>(count), first, mask[first], want_mask[first]);
    }
  }
  long kept = 0;
  for (int64_t i = 0; i < count; ++i) kept += want_mask[i];
  ++checks;
  if (!ok) {
    ++failures;
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s  kept %ld (%.2f s)\n", ok ? "done" : "FAILED", label, kept, seconds);
  std::fflush(stdout);
}

template <typename T>
void backward_case(int64_t count, const Offsets& off, double scale) {
  const auto start = std::chrono::steady_clock::now();
  const DType dtype = type_dtype<T>();
  std::mt19937_64 engine(static_cast<uint64_t>(count * 17 + off.x * 5 + off.out * 11 + off.mask + sizeof(T)));
  std::normal_distribution<double> normal;
  emu::Buffer<T> dout(count, "dout", off.x, 0, 32);
  emu::Buffer<uint8_t> mask(count, "mask", off.mask, 0, 32);
  std::vector<T> dout_host(count);
  std::vector<uint8_t> mask_host(count);
  for (int64_t i = 0; i < count; ++i) {
    dout_host[i] = T(static_cast<compute_t<T>>(2.0 * normal(engine)));
    dout[i] = dout_host[i];
    const uint64_t r = engine() % 10;
    // Mostly 0/1 as dropout writes them; a few other nonzero bytes (any nonzero byte keeps).
    mask_host[i] = r < 3 ? 0 : r == 9 ? 0x80 : 1;
    mask[i] = mask_host[i];
  }
  std::unique_ptr<emu::Buffer<T>> dx_buffer;
  if (!off.alias) dx_buffer = std::make_unique<emu::Buffer<T>>(count, "dx", off.out, 0xff, 32);
  T* dx = off.alias ? dout.data : dx_buffer->data;
  dropout_backward_cuda(dout.data, mask.data, dx, dtype, count, scale, nullptr);
  std::vector<T> want(count);
  dropout_backward_cpu(dout_host.data(), mask_host.data(), want.data(), dtype, count, scale);

  const bool quads_expected = off.x % (4 * sizeof(T)) == 0 && (off.alias || off.out % (4 * sizeof(T)) == 0) &&
                              off.mask % 4 == 0;
  char label[200];
  std::snprintf(label, sizeof label, "dropout backward %-4s n %5ld %-16s  %s", type_name<T>(),
                static_cast<long>(count), off.name, quads_expected ? "quads" : "scalar");
  bool ok = true;
  long first = -1;
  const long wrong = count_differ(dx, want.data(), count, sizeof(T), &first);
  if (wrong != 0) {
    ok = false;
    std::printf("FAIL %s: dx: %ld of %ld differ, first at %ld: %.9g vs %.9g\n", label, wrong,
                static_cast<long>(count), first, as_double(dx[first]), as_double(want[first]));
  }
  ++checks;
  if (!ok) {
    ++failures;
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s %s (%.2f s)\n", ok ? "done" : "FAILED", label, seconds);
  std::fflush(stdout);
}

template <typename T>
void dropout_all(const std::vector<int64_t>& counts) {
  for (int64_t count : counts) {
    for (const Offsets& off : offsets_for<T>()) {
      for (bool with_mask : {true, false}) {
        dropout_case<T>(count, off, with_mask, false, 0.3f);
        if (off.x == 0 && off.out == 0) dropout_case<T>(count, off, with_mask, true, 0.3f);
      }
      backward_case<T>(count, off, 1.0 / 0.7);
    }
  }
  for (float p : {0.0f, 0.5f, 1.0f}) dropout_case<T>(1023, offsets_for<T>()[0], true, true, p);
}

// uniform / normal / randint: every element's bytes as the CPU's.
template <typename T>
void draw_case(const char* what, DType dtype, int64_t count, bool replayed) {
  const uint64_t seed = 0xA4093822299F31D0ull, offset = 4242;
  const philox::ReplayState state{0x082EFA98EC4E6C89ull, 31337};
  const uint64_t s = replayed ? state.seed : seed, o = replayed ? state.offset + offset : offset;
  emu::Buffer<T> out(count, "out");
  emu::Buffer<philox::ReplayState> replay(1, "replay", 0, 0);
  replay[0] = state;
  const philox::ReplayState* r = replayed ? replay.data : nullptr;
  std::vector<T> want(count);
  const std::string kind = what;
  if (kind == "uniform") {
    uniform_cuda(out.data, dtype, count, seed, offset, nullptr, r);
    uniform_cpu(want.data(), dtype, count, s, o);
  } else if (kind == "normal") {
    normal_cuda(out.data, dtype, count, seed, offset, nullptr, r);
    normal_cpu(want.data(), dtype, count, s, o);
  } else {
    randint_cuda(out.data, dtype, count, -50, 1000, seed, offset, nullptr, r);
    randint_cpu(want.data(), dtype, count, -50, 1000, s, o);
  }
  long first = -1;
  const long wrong = count_differ(out.data, want.data(), count, sizeof(T), &first);
  ++checks;
  char label[160];
  std::snprintf(label, sizeof label, "%-7s %-4s n %5ld %s", what, dtype_name(dtype).data(), static_cast<long>(count),
                replayed ? "replay" : "");
  if (wrong != 0) {
    ++failures;
    std::printf("FAIL %s: %ld of %ld differ, first at %ld\n", label, wrong, static_cast<long>(count), first);
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
  std::printf("%s %s\n", wrong == 0 ? "done" : "FAILED", label);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  std::vector<int64_t> counts = {1, 3, 4, 5, 1023, 4097};
  if (argc > 1) counts = {std::atoll(argv[1])};
  dropout_all<float>(counts);
  dropout_all<double>(counts);
  dropout_all<Half>(counts);
  dropout_all<BFloat16>(counts);
  for (int64_t count : counts) {
    for (bool replayed : {false, true}) {
      draw_case<float>("uniform", DType::f32, count, replayed);
      draw_case<double>("uniform", DType::f64, count, replayed);
      draw_case<uint16_t>("uniform", DType::f16, count, replayed);
      draw_case<uint16_t>("uniform", DType::bf16, count, replayed);
      draw_case<float>("normal", DType::f32, count, replayed);
      draw_case<double>("normal", DType::f64, count, replayed);
      draw_case<uint16_t>("normal", DType::bf16, count, replayed);
      draw_case<int64_t>("randint", DType::i64, count, replayed);
      draw_case<int32_t>("randint", DType::i32, count, replayed);
      draw_case<float>("randint", DType::f32, count, replayed);
      draw_case<uint16_t>("randint", DType::f16, count, replayed);
    }
  }
  std::printf("quad_aligned %s (%d dropout cases checked against it)\n",
              path_checks > 0 ? "present: the quads flag matched the expected path" : "absent", path_checks);
  std::printf("%d of %d checks failed; %ld launches, %ld CTAs emulated\n", failures, checks, emu::launches.load(),
              emu::ctas.load());
  return failures == 0 ? 0 : 1;
}
