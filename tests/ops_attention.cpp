// Op-table rows of the attention family (core/ops/attention.cpp). Head dims
// of 32 and 64 reach the CUDA flash kernels in the parity run (other head dims
// and Ev != E take the matmul + softmax path); lengths above 64 cross the
// kernels' tile edges. Masks are inputs the rows make themselves: they are not
// differentiable (grad_inputs = q, k, v).
#include <optional>
#include <random>

#include "core/nn_ops.h"
#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;

// q, k, v from the sample's first three shapes; a mask from the fourth, if any:
// bool (about a quarter false, and row 1 wholly false) or additive float.
Inputs attention_inputs(const OpSample& sample, DType dtype, uint64_t seed, bool bool_mask) {
  Inputs inputs = default_inputs(OpSample{{sample.shapes[0], sample.shapes[1], sample.shapes[2]}, ""}, dtype, seed);
  if (sample.shapes.size() > 3) {
    const Shape& shape = sample.shapes[3];
    const int64_t n = shape_numel(shape), cols = shape.back();
    std::mt19937_64 engine(seed + 5);
    if (bool_mask) {
      std::vector<uint8_t> allowed(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = i / cols % shape[shape.size() - 2];
        allowed[static_cast<size_t>(i)] = row == 1 ? 0 : (engine() % 4 != 0);
      }
      inputs.push_back(tensor<uint8_t>(allowed, shape).to(DType::b8));
    } else {
      std::uniform_real_distribution<double> uniform(-2.0, 1.0);
      std::vector<double> values(static_cast<size_t>(n));
      for (double& value : values) value = uniform(engine);
      inputs.push_back(tensor<double>(values, shape).to(dtype));
    }
  }
  return inputs;
}

OpInfo attention_row(std::string name, std::vector<OpSample> samples, bool causal, bool bool_mask = false,
                     std::optional<double> scale = std::nullopt) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = [causal, scale](const Inputs& in) {
    return scaled_dot_product_attention(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(), 0.0, causal, scale);
  };
  info.samples = std::move(samples);
  info.make_inputs = [bool_mask](const OpSample& sample, DType dtype, uint64_t seed) {
    return attention_inputs(sample, dtype, seed, bool_mask);
  };
  info.grad_inputs = {0, 1, 2};
  // The CUDA kernels round the probabilities P (and dS) to the 16-bit input
  // type before their products, as flash-attention does: an absolute error up
  // to about half an ulp of the type (2^-11, 2^-8) times sum_j p_j |v_j|.
  info.parity_by_dtype = {{DType::f16, {2e-3, 1e-3}}, {DType::bf16, {3.2e-2, 5e-3}}};
  info.tolerance_note = "16-bit P and dS in the flash kernels";
  return info;
}

}  // namespace

std::vector<OpInfo> attention_op_infos() {
  std::vector<OpInfo> rows;
  rows.push_back(attention_row("scaled_dot_product_attention",
                               {{{{2, 3, 5, 32}, {2, 3, 7, 32}, {2, 3, 7, 32}}, "(B,H,L,E) L 5 S 7 E 32"},
                                {{{1, 2, 70, 16}, {1, 2, 130, 16}, {1, 2, 130, 16}}, "across tiles, E 16"},
                                {{{3, 4, 8}, {3, 6, 8}, {3, 6, 8}}, "3-d (N,L,E)"},
                                {{{2, 1, 3, 64}, {2, 1, 0, 64}, {2, 1, 0, 64}}, "no keys (S 0)"}},
                               /*causal=*/false));
  rows.push_back(attention_row("scaled_dot_product_attention causal",
                               {{{{2, 2, 9, 32}, {2, 2, 9, 32}, {2, 2, 9, 32}}, "L = S"},
                                {{{1, 1, 67, 64}, {1, 1, 80, 64}, {1, 1, 80, 64}}, "across tiles, L < S"},
                                {{{1, 2, 12, 16}, {1, 2, 5, 16}, {1, 2, 5, 16}}, "L > S"}},
                               /*causal=*/true));
  rows.push_back(attention_row("scaled_dot_product_attention additive mask",
                               {{{{2, 2, 6, 32}, {2, 2, 9, 32}, {2, 2, 9, 32}, {6, 9}}, "mask (L,S)"},
                                {{{2, 3, 5, 32}, {2, 3, 66, 32}, {2, 3, 66, 32}, {2, 1, 1, 66}}, "mask (B,1,1,S)"}},
                               /*causal=*/false, /*bool_mask=*/false, /*scale=*/0.3));
  rows.push_back(attention_row("scaled_dot_product_attention bool mask",
                               {{{{2, 2, 6, 32}, {2, 2, 9, 32}, {2, 2, 9, 32}, {2, 2, 6, 9}}, "a fully masked row"}},
                               /*causal=*/false, /*bool_mask=*/true));
  rows.push_back(attention_row("scaled_dot_product_attention value dim",
                               {{{{2, 2, 4, 8}, {2, 2, 6, 8}, {2, 2, 6, 5}}, "Ev 5 != E 8 (matmul path)"}},
                               /*causal=*/false));
  return rows;
}

}  // namespace kiln::testing
