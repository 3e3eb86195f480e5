// The op table: every op joins the tests by adding one row (an OpInfo) in
// tests/ops_<family>.cpp. tests/test_op_table.cpp runs, for every row:
//   - float64 gradcheck on the CPU for each sample, also with non-contiguous inputs;
//   - CUDA-vs-CPU parity for each listed dtype (skipped visibly without a GPU);
//   - with new allocations poisoned with NaN, so an unwritten element fails.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln::testing {

struct OpSample {
  std::vector<Shape> shapes;  // one per input
  std::string label;          // e.g. "broadcast", "empty", "odd size"
};

struct OpInfo {
  std::string name;
  // Computes the op from its inputs (the row decides scalar arguments).
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<OpSample> samples;
  // Dtypes for CUDA-vs-CPU parity (the CPU result in the same dtype is the reference).
  std::vector<DType> parity_dtypes = {DType::f32, DType::f16, DType::bf16};
  bool differentiable = true;
  // Makes the inputs for a sample; the default draws randn in `dtype` with `seed`.
  // Rows override it for ops that need positive inputs, integer indices, etc.
  std::function<std::vector<Tensor>(const OpSample&, DType dtype, uint64_t seed)> make_inputs;
  // Indices of inputs to gradcheck; empty means every floating input.
  std::vector<int> grad_inputs;
  // Looser parity tolerance for a named path (TF32, reduced-precision accumulation); 0 = default.
  double parity_rtol = 0;
  double parity_atol = 0;
  // Per-dtype (rtol, atol) for a named path, in place of the above for that dtype.
  std::map<DType, std::pair<double, double>> parity_by_dtype;
  std::string tolerance_note;
};

// Rows, one function per op family (defined in tests/ops_<family>.cpp).
std::vector<OpInfo> elementwise_op_infos();
std::vector<OpInfo> reduction_op_infos();
std::vector<OpInfo> linalg_op_infos();
std::vector<OpInfo> softmax_op_infos();
std::vector<OpInfo> indexing_op_infos();
std::vector<OpInfo> shape_op_infos();
std::vector<OpInfo> view_op_infos();
std::vector<OpInfo> nn_op_infos();
std::vector<OpInfo> attention_op_infos();

// randn inputs of the sample's shapes in `dtype` on the cpu.
std::vector<Tensor> default_inputs(const OpSample& sample, DType dtype, uint64_t seed);

}  // namespace kiln::testing
