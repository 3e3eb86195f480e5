// Runs attention_tc*.cu's kernels (emulated on the CPU) against a float64
// reference: out, lse, dq, dk, dv, every element written.
#include "prelude.h"
#include "emu_attention_tc.inc"
#include "attention_reference.h"

#include <chrono>
#include <limits>
#include <random>
#include <string>

using namespace kiln;
using namespace kiln::kernels;
using kiln::kernels::attention_tc::emu_to_float;
using namespace emu_attention;


template <typename T>
uint16_t bits_of(float x) {
  T h;
  if constexpr (std::is_same_v<T, __half>) h = __float2half_rn(x); else h = __float2bfloat16_rn(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// A buffer of 16-bit values, optionally starting 2 bytes past a 16-byte boundary.
struct Buffer16 {
  std::vector<uint16_t> storage;
  uint16_t* data;
  Buffer16(size_t n, bool unaligned, uint16_t fill) : storage(n + 16, fill) {
    auto base = reinterpret_cast<uintptr_t>(storage.data());
    size_t skip = (16 - base % 16) % 16 / 2 + (unaligned ? 1 : 0);
    data = storage.data() + skip;
  }
};

int failures = 0;

void compare(const char* what, const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
             const std::string& label) {
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) && got[i] == want[i]) continue;
    const double err = std::abs(got[i] - want[i]), allowed = atol + rtol * std::abs(want[i]);
    if (!(err <= allowed)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (worst < 0 || excess > worst_excess) { worst_excess = excess; worst = static_cast<int64_t>(i); }
    }
  }
  if (bad > 0) {
    ++failures;
    std::printf("FAIL %s %s: %ld of %zu differ; worst at %ld: %g vs %g\n", label.c_str(), what, bad, got.size(), worst,
                got[worst], want[worst]);
    if (std::getenv("EMU_STOP")) std::exit(1);
  }
}

template <typename T>
void run(const Problem& c, int64_t E, DType dtype) {
  const bool f16 = std::is_same_v<T, __half>;
  std::string label = std::string(f16 ? "f16" : "bf16") + " E" + std::to_string(E) + " B" + std::to_string(c.B) + " H" +
                      std::to_string(c.H) + " L" + std::to_string(c.L) + " S" + std::to_string(c.S) +
                      (c.causal ? " causal" : "") + " mask" + std::to_string(c.mask) +
                      (c.dropout > 0 ? " dropout" : "") + (c.unaligned ? " unaligned" : "") + (c.fused ? " fused" : "") +
                      (c.replay ? " replay" : "") +
                      (emu::eager ? " eager" : "");
  const auto start = std::chrono::steady_clock::now();
  const int64_t BH = c.B * c.H, L = c.L, S = c.S;
  std::mt19937_64 engine(static_cast<uint64_t>(L * 1000 + S * 7 + E + c.mask));
  std::normal_distribution<float> normal;
  if (c.fused && L != S) {
    std::printf("FAIL %s: a fused problem needs L = S\n", label.c_str());
    ++failures;
    return;
  }
  // Layouts (element strides over B, H, T) and where each operand starts in its buffer.
  const int64_t HE = c.H * E;
  const Layouts layouts(c, E);
  const auto at = [&](const AttentionLayout& l, int64_t bh, int64_t t, int64_t d) { return element_at(l, c.H, bh, t, d); };
  // Dense values (bh, t, d) for the reference, stored through `layout` from `base`.
  auto fill = [&](uint16_t* base, const AttentionLayout& layout, std::vector<double>& values, int64_t len) {
    values.resize(BH * len * E);
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t d = 0; d < E; ++d) {
          const uint16_t bits = bits_of<T>(normal(engine));
          base[at(layout, bh, t, d)] = bits;
          values[(bh * len + t) * E + d] = emu_to_float<T>(bits);
        }
      }
    }
  };
  std::vector<double> q, k, v, dout;
  Buffer16 qb(c.fused ? BH * L * 3 * E : BH * L * E, c.unaligned, 0), kb(c.fused ? 0 : BH * S * E, c.unaligned, 0),
      vb(c.fused ? 0 : BH * S * E, c.unaligned, 0), dob(BH * L * E, false, 0);
  uint16_t* q_base = qb.data;
  uint16_t* k_base = c.fused ? qb.data + HE : kb.data;
  uint16_t* v_base = c.fused ? qb.data + 2 * HE : vb.data;
  fill(q_base, layouts.q, q, L);
  fill(k_base, layouts.kv, k, S);
  fill(v_base, layouts.kv, v, S);
  fill(dob.data, layouts.dout, dout, L);
  // The additive mask, float32, and its strides over (B, L, S).
  const Mask mask = make_mask(c, engine, normal);
  const RandomArguments random = random_arguments(c);
  const AttentionArgs args =
      forward_args(c, E, dtype, layouts, q_base, k_base, v_base, mask, mask.values.data(), &random.state);
  Buffer16 outb(BH * L * E, false, 0xffff);
  std::vector<float> lse(BH * L, std::numeric_limits<float>::quiet_NaN());
  attention_tc::forward(args, outb.data, lse.data(), nullptr);
  // Read back through a layout into dense (bh, t, d) order.
  const auto widen = [&](const Buffer16& b, const AttentionLayout& layout, int64_t len) {
    std::vector<double> x(BH * len * E);
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t d = 0; d < E; ++d) x[(bh * len + t) * E + d] = emu_to_float<T>(b.data[at(layout, bh, t, d)]);
      }
    }
    return x;
  };
  const std::vector<double> out = widen(outb, layouts.out, L);
  // delta as attention.cu's delta kernel computes it: float sums of dout * out.
  std::vector<float> delta(BH * L);
  for (int64_t r = 0; r < BH * L; ++r) {
    float sum = 0;
    for (int64_t d = 0; d < E; ++d) sum += static_cast<float>(dout[r * E + d] * out[r * E + d]);
    delta[r] = sum;
  }
  Buffer16 dqb(BH * L * E, false, 0xffff), dkb(BH * S * E, false, 0xffff), dvb(BH * S * E, false, 0xffff);
  const AttentionGradArgs grad = backward_args(c, args, layouts, outb.data, lse.data(), dob.data, dqb.data, dkb.data, dvb.data);
  if (S > 0) attention_tc::backward(grad, delta.data(), nullptr);

  const Reference ref = reference(c, E, q, k, v, dout, mask, args.scale, kSeed, kOffset);
  const double rtol = f16 ? 2e-3 : 3.2e-2, atol = f16 ? 1e-3 : 5e-3;
  compare("out", out, ref.out, rtol, atol, label);
  std::vector<double> lse_d(lse.begin(), lse.end());
  compare("lse", lse_d, ref.lse, 1e-3, 1e-3, label);
  if (S > 0) {
    compare("dq", widen(dqb, layouts.out, L), ref.dq, 4 * rtol, 4 * atol, label);
    compare("dk", widen(dkb, layouts.dk, S), ref.dk, 4 * rtol, 4 * atol, label);
    compare("dv", widen(dvb, layouts.dv, S), ref.dv, 4 * rtol, 4 * atol, label);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s (%.1f s)\n", label.c_str(), seconds);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  const std::vector<Problem>& cases = problems();
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;  // a head dim, or all
  emu::eager = argc > 2 && std::string(argv[2]) == "eager";
  for (int64_t E : {32, 64, 96, 128}) {
    if (only > 0 && E != only) continue;
    for (const Problem& c : cases) {
      run<__half>(c, E, DType::f16);
      run<__nv_bfloat16>(c, E, DType::bf16);
    }
  }
  std::printf("%d failures; %ld mma, %ld ldmatrix, %ld copies, %ld wgmma emulated\n", failures, emu::mma_count.load(),
              emu::ldmatrix_count.load(), emu::copy_count.load(), emu::wgmma_count.load());
  return failures == 0 ? 0 : 1;
}
