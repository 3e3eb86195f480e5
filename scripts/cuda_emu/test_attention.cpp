// attention.cu's reference kernels (float32 on CUDA cores; float16 and
// bfloat16 through mma.sync and ldmatrix, emulated by emu_cuda.h) and its
// delta kernel (which the tensor-core backward runs too), through
// attention_forward_cuda / attention_backward_cuda with the reference kernels
// forced, against attention_reference.h's float64 forward and backward: out,
// lse, the delta workspace (dout . out per row, against the stored out), dq,
// dk and dv; every output starts as NaN. main.cpp's problems (sizes past a
// block, Tk = 0, causal, masks, rows with no allowed key, dropout, operands
// off 16 bytes, q/k/v read in place from one fused projection with out, dq
// and dk written as (B, T, H, E)), every head dim, the three dtypes; and a
// backward asked for dv only (null dq, dk), whose dv must be the full one's bits.
//   test_attention [head_dim [f32|f16|bf16]]
#include "emu_test.h"

namespace kiln::kernels {
namespace {
// attention.cu's inline-PTX wrappers (gen_cu.py --emulate removes them there).
template <typename T>
void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  emu::mma_m16n8k16<T>(c, a, b0, b1);
}
void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { emu::ldmatrix_x4(r, row, true); }
}  // namespace
}  // namespace kiln::kernels

#include "emu_attention.inc"
#include "attention_reference.h"

#include <chrono>
#include <string>

// attention.cu sends 16-bit problems here unless the reference kernels are forced; this driver forces them.
namespace kiln::kernels::attention_tc {
bool supports(DType, int64_t) { return false; }
void forward(const AttentionArgs&, void*, void*, cuda::Stream) { EMU_REQUIRE(false, "attention_tc::forward called"); }
void backward(const AttentionGradArgs&, const float*, cuda::Stream) {
  EMU_REQUIRE(false, "attention_tc::backward called");
}
}  // namespace kiln::kernels::attention_tc

using namespace kiln;
using namespace kiln::kernels;
using namespace emu_test;
using namespace emu_attention;

namespace {

template <typename T>
void run(const Problem& c, int64_t E, bool dv_only_too) {
  const std::string label = std::string(name_of<T>()) + " E" + std::to_string(E) + " B" + std::to_string(c.B) +
                            " H" + std::to_string(c.H) + " L" + std::to_string(c.L) + " S" + std::to_string(c.S) +
                            (c.causal ? " causal" : "") + " mask" + std::to_string(c.mask) +
                            (c.dropout > 0 ? " dropout" : "") + (c.unaligned ? " unaligned" : "") +
                            (c.fused ? " fused" : "") + (c.replay ? " replay" : "");
  const auto start = std::chrono::steady_clock::now();
  const int64_t BH = c.B * c.H, L = c.L, S = c.S, HE = c.H * E;
  std::mt19937_64 engine(static_cast<uint64_t>(L * 1000 + S * 7 + E + c.mask));
  std::normal_distribution<float> normal;
  EMU_REQUIRE(!c.fused || L == S, "a fused problem needs L = S");
  const Layouts layouts(c, E);
  const auto at = [&](const AttentionLayout& l, int64_t bh, int64_t t, int64_t d) { return element_at(l, c.H, bh, t, d); };

  // q, k, v: one (B, L, 3, H, E) buffer when fused; one element off 16 bytes when unaligned.
  const size_t misalign = c.unaligned ? sizeof(T) : 0;
  emu::Buffer<T> qb(c.fused ? BH * L * 3 * E : BH * L * E, "q", misalign, 0);
  emu::Buffer<T> kb(c.fused ? 0 : BH * S * E, "k", misalign, 0), vb(c.fused ? 0 : BH * S * E, "v", misalign, 0);
  emu::Buffer<T> dob(BH * L * E, "dout", 0, 0);
  T* q_base = qb.data;
  T* k_base = c.fused ? qb.data + HE : kb.data;
  T* v_base = c.fused ? qb.data + 2 * HE : vb.data;
  // Dense values (bh, t, d) for the reference, stored through `layout`.
  const auto fill = [&](T* base, const AttentionLayout& layout, std::vector<double>& values, int64_t len) {
    values.resize(BH * len * E);
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t d = 0; d < E; ++d) {
          const T x = from_double<T>(normal(engine));
          base[at(layout, bh, t, d)] = x;
          values[(bh * len + t) * E + d] = to_double(x);
        }
      }
    }
  };
  std::vector<double> q, k, v, dout;
  fill(q_base, layouts.q, q, L);
  fill(k_base, layouts.kv, k, S);
  fill(v_base, layouts.kv, v, S);
  fill(dob.data, layouts.dout, dout, L);
  const Mask mask = make_mask(c, engine, normal);
  emu::Buffer<float> mask_buffer(mask.values.size(), "mask", 0, 0);
  std::copy(mask.values.begin(), mask.values.end(), mask_buffer.data);

  emu::Buffer<philox::ReplayState> replay_state(c.replay ? 1 : 0, "replay state", 0, 0);
  if (c.replay) replay_state[0] = random_arguments(c).state;
  const AttentionArgs args = forward_args(c, E, emu_dtype<T>(), layouts, q_base, k_base, v_base, mask,
                                          mask_buffer.data, replay_state.data);
  emu::Buffer<T> outb(BH * L * E, "out");
  emu::Buffer<float> lse(BH * L, "lse");
  attention_forward_cuda(args, outb.data, lse.data, nullptr);

  // Read back through a layout into dense (bh, t, d) order.
  const auto widen = [&](const T* base, const AttentionLayout& layout, int64_t len) {
    std::vector<double> x(BH * len * E);
    for (int64_t bh = 0; bh < BH; ++bh) {
      for (int64_t t = 0; t < len; ++t) {
        for (int64_t d = 0; d < E; ++d) x[(bh * len + t) * E + d] = to_double(base[at(layout, bh, t, d)]);
      }
    }
    return x;
  };
  const std::vector<double> out = widen(outb.data, layouts.out, L);

  emu::Buffer<T> dqb(BH * L * E, "dq"), dkb(BH * S * E, "dk"), dvb(BH * S * E, "dv");
  AttentionGradArgs grad = backward_args(c, args, layouts, outb.data, lse.data, dob.data, dqb.data, dkb.data, dvb.data);
  emu::Buffer<float> workspace(attention_backward_workspace_bytes(grad) / sizeof(float), "delta");
  attention_backward_cuda(grad, workspace.data, nullptr);

  const Reference ref = reference(c, E, q, k, v, dout, mask, args.scale, kSeed, kOffset);
  // float32 kernels: sums in float (no rounding of P); 16-bit: P and dS rounded to T as FlashAttention does.
  const bool f32 = std::is_same_v<T, float>, f16 = std::is_same_v<T, __half>;
  const double rtol = f32 ? 1e-5 : f16 ? 2e-3 : 3.2e-2, atol = f32 ? 1e-5 : f16 ? 1e-3 : 5e-3;
  compare(label, "out", out, ref.out, rtol, atol);
  compare(label, "lse", std::vector<double>(lse.data, lse.data + BH * L), ref.lse, f32 ? 1e-6 : 1e-3, f32 ? 1e-6 : 1e-3);
  // delta against the out the kernel wrote (float sums of E products).
  std::vector<double> delta_want(BH * L), delta_got(workspace.data, workspace.data + BH * L);
  for (int64_t r = 0; r < BH * L; ++r) {
    double sum = 0;
    for (int64_t d = 0; d < E; ++d) sum += dout[r * E + d] * out[r * E + d];
    delta_want[r] = sum;
  }
  compare(label, "delta", delta_got, delta_want, 1e-5, 1e-6);
  const std::vector<double> dv_full = widen(dvb.data, layouts.dv, S);
  if (S > 0) {
    compare(label, "dq", widen(dqb.data, layouts.out, L), ref.dq, 4 * rtol, 4 * atol);
    compare(label, "dk", widen(dkb.data, layouts.dk, S), ref.dk, 4 * rtol, 4 * atol);
    compare(label, "dv", dv_full, ref.dv, 4 * rtol, 4 * atol);
  }
  if (dv_only_too) {  // null dq and dk: the dK/dV kernel skips dk's stores, the dQ kernel does not run
    emu::Buffer<T> dv_only(BH * S * E, "dv (alone)");
    grad.dq = nullptr;
    grad.dk = nullptr;
    grad.dv = dv_only.data;
    attention_backward_cuda(grad, workspace.data, nullptr);
    const std::vector<double> got = widen(dv_only.data, layouts.dv, S);
    ++checks;
    if (std::memcmp(got.data(), dv_full.data(), got.size() * sizeof(double)) != 0) {
      ++failures;
      std::printf("FAIL %s: dv alone differs from dv with dq and dk\n", label.c_str());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done %s (%.1f s)\n", label.c_str(), seconds);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  emu::install_fault_handler();
  set_attention_cuda_kernels(AttentionCudaKernels::reference);
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;  // a head dim, or all
  const std::string dtype = argc > 2 ? argv[2] : "";
  const std::vector<Problem>& cases = problems();
  for (int64_t E : {32, 64, 96, 128}) {
    if (only > 0 && E != only) continue;
    for (size_t i = 0; i < cases.size(); ++i) {
      const bool dv_only_too = i == 1;
      if (dtype.empty() || dtype == "f32") run<float>(cases[i], E, dv_only_too);
      if (dtype.empty() || dtype == "f16") run<__half>(cases[i], E, dv_only_too);
      if (dtype.empty() || dtype == "bf16") run<__nv_bfloat16>(cases[i], E, dv_only_too);
    }
  }
  std::printf("%d of %d checks failed; %ld mma, %ld ldmatrix emulated; %ld launches\n", failures, checks,
              emu::mma_count.load(), emu::ldmatrix_count.load(), emu::launches.load());
  return failures == 0 ? 0 : 1;
}
