// Op-table rows of the linalg family (core/ops/linalg.cpp): matmul in every
// torch.matmul form (2-D, batched with broadcast, folded 3-D @ 2-D, 1-D
// operands), mm with transposed (non-contiguous) inputs, bmm, linear with and
// without bias, an odd size ((37, 53) @ (53, 29)) and an empty product.
//
// Each op has two rows: one for float32 parity with a named tolerance (no
// TF32: Eigen and cuBLAS add the k products in different orders, so the
// default elementwise float32 tolerance is too tight for sums of 53 terms),
// one for float16/bfloat16 parity at the default tolerances.
#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;

// Rows `name` (float32 parity, named tolerance) and `name + " 16-bit"`.
// (Designated initializers: GCC 12 misreports the default parity_dtypes
// initializer as maybe-uninitialized when OpInfo is default-constructed here.)
void add_rows(std::vector<OpInfo>& rows, const std::string& name, std::function<Tensor(const Inputs&)> fn,
              std::vector<OpSample> samples) {
  rows.push_back(OpInfo{.name = name,
                        .fn = fn,
                        .samples = samples,
                        .parity_dtypes = {DType::f32},
                        .parity_rtol = 2e-5,
                        .parity_atol = 2e-5,
                        .tolerance_note = "float32 GEMM without TF32: CPU and cuBLAS sum in different orders"});
  rows.push_back(OpInfo{.name = name + " 16-bit",
                        .fn = std::move(fn),
                        .samples = std::move(samples),
                        .parity_dtypes = {DType::f16, DType::bf16}});
}

}  // namespace

std::vector<OpInfo> linalg_op_infos() {
  std::vector<OpInfo> rows;
  add_rows(rows, "matmul", [](const Inputs& in) { return matmul(in[0], in[1]); },
           {{{{3, 4}, {4, 5}}, "2-d"},
            {{{37, 53}, {53, 29}}, "odd size"},
            {{{0, 5}, {5, 3}}, "empty"},
            {{{3, 4, 0}, {0, 2}}, "k = 0"},
            {{{2, 1, 3, 4}, {5, 4, 2}}, "batched, broadcast"},
            {{{3, 4}, {2, 4, 5}}, "2-d @ 3-d, broadcast"},
            {{{2, 3, 4}, {4, 5}}, "3-d @ 2-d, folded"},
            {{{2, 3, 4}, {2, 4, 5}}, "batched"},
            {{{4}, {4, 3}}, "1-d @ 2-d"},
            {{{3, 4}, {4}}, "2-d @ 1-d"},
            {{{4}, {4}}, "1-d @ 1-d"},
            {{{2, 3, 4}, {4}}, "3-d @ 1-d"},
            {{{4}, {2, 4, 3}}, "1-d @ 3-d"}});
  add_rows(rows, "mm", [](const Inputs& in) { return mm(in[0], in[1]); },
           {{{{3, 4}, {4, 5}}, "2-d"}, {{{37, 53}, {53, 29}}, "odd size"}, {{{0, 5}, {5, 3}}, "empty"}});
  // Both operands transposed views: the GEMM gets transpose flags, no copy.
  add_rows(rows, "mm transposed", [](const Inputs& in) { return mm(in[0].t(), in[1].t()); },
           {{{{5, 3}, {4, 5}}, "2-d"}, {{{53, 37}, {29, 53}}, "odd size"}});
  add_rows(rows, "bmm", [](const Inputs& in) { return bmm(in[0], in[1]); },
           {{{{3, 4, 5}, {3, 5, 2}}, "3-d"}, {{{2, 37, 53}, {2, 53, 29}}, "odd size"},
            {{{0, 4, 5}, {0, 5, 2}}, "empty batch"}});
  add_rows(rows, "linear", [](const Inputs& in) { return linear(in[0], in[1], in[2]); },
           {{{{4, 5}, {3, 5}, {3}}, "2-d"},
            {{{2, 3, 5}, {3, 5}, {3}}, "3-d input"},
            {{{5}, {3, 5}, {3}}, "1-d input"},
            {{{37, 53}, {29, 53}, {29}}, "odd size"},
            {{{0, 5}, {3, 5}, {3}}, "empty"}});
  add_rows(rows, "linear no bias", [](const Inputs& in) { return linear(in[0], in[1]); },
           {{{{4, 5}, {3, 5}}, "2-d"}, {{{2, 3, 5}, {3, 5}}, "3-d input"}, {{{0, 5}, {3, 5}}, "empty"}});
  return rows;
}

}  // namespace kiln::testing
