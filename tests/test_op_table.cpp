// Runs every row of the op table (tests/ops_<family>.cpp): float64 gradcheck
// on the CPU (contiguous and non-contiguous inputs), a CPU run with NaN-poisoned
// allocations, and CUDA-vs-CPU parity per dtype (skipped visibly without a GPU).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "core/allocator.h"
#include "tests/support/op_info.h"
#include "tests/support/test_util.h"

namespace kiln::testing {
namespace {

std::vector<OpInfo> all_rows() {
  std::vector<OpInfo> rows;
  for (auto family : {elementwise_op_infos, reduction_op_infos, linalg_op_infos, softmax_op_infos,
                      indexing_op_infos, shape_op_infos, view_op_infos, nn_op_infos, attention_op_infos}) {
    for (OpInfo& row : family()) rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<Tensor> make_inputs(const OpInfo& row, const OpSample& sample, DType dtype, uint64_t seed) {
  return row.make_inputs ? row.make_inputs(sample, dtype, seed) : default_inputs(sample, dtype, seed);
}

std::vector<int> grad_input_indices(const OpInfo& row, const std::vector<Tensor>& inputs) {
  if (!row.grad_inputs.empty()) return row.grad_inputs;
  std::vector<int> indices;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && is_floating(inputs[i].dtype())) indices.push_back(static_cast<int>(i));
  }
  return indices;
}

// Poisons new allocations for the scope: an output element a kernel forgets to
// write stays NaN (or 0xFF..) and fails the comparison.
struct PoisonGuard {
  PoisonGuard() { set_poison_allocations(true); }
  ~PoisonGuard() { set_poison_allocations(false); }
};

}  // namespace

TEST_CASE("op table: every op of core/ops.h has a row") {
  const std::vector<std::string> required = {
      "add", "sub", "mul", "div", "maximum", "minimum", "neg", "exp", "log", "sqrt", "rsqrt", "abs", "pow",
      "relu", "gelu", "silu", "sigmoid", "tanh", "clamp", "where", "eq", "lt", "gt", "cast",
      "sum", "mean", "var", "amax", "amin", "max", "min", "argmax", "norm",
      "matmul", "mm", "bmm", "linear",
      "softmax", "log_softmax", "cross_entropy", "nll_loss",
      "index_select", "gather", "scatter_add", "embedding",
      "cat", "stack", "split", "chunk",
      "view", "reshape", "permute", "transpose", "narrow", "slice", "expand", "squeeze", "unsqueeze", "flatten",
      "conv2d", "batch_norm", "layer_norm", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
      "scaled_dot_product_attention", "sin", "cos", "masked_fill", "tril", "triu", "cumsum", "topk", "rms_norm"};
  std::set<std::string> names;
  for (const OpInfo& row : all_rows()) {
    // A row is named "<op>" or "<op> <variant>".
    names.insert(row.name.substr(0, row.name.find(' ')));
  }
  for (const std::string& op : required) CHECK_MESSAGE(names.count(op) == 1, "no op-table row for '" << op << "'");
}

TEST_CASE("op table: float64 gradcheck on the CPU, contiguous and non-contiguous") {
  int checked = 0;
  for (const OpInfo& row : all_rows()) {
    if (!row.differentiable) continue;
    for (const OpSample& sample : row.samples) {
      for (bool contiguous : {true, false}) {
        INFO("op '" << row.name << "' sample '" << sample.label << "'" << (contiguous ? "" : " (non-contiguous)"));
        std::vector<Tensor> inputs;
        try {
          inputs = make_inputs(row, sample, DType::f64, 7);
          if (!contiguous) {
            for (Tensor& input : inputs) {
              if (input.defined() && is_floating(input.dtype())) input = non_contiguous_copy(input);
            }
          }
          for (int index : grad_input_indices(row, inputs)) inputs[index].requires_grad_(true);
          std::string failure = gradcheck(row.fn, inputs);
          CHECK_MESSAGE(failure.empty(), failure);
        } catch (const Error& error) {
          FAIL_CHECK("threw: " << std::string(error.what()));
        }
        ++checked;
      }
    }
  }
  MESSAGE("gradcheck ran on " << checked << " (op, sample, layout) cases");
}

TEST_CASE("op table: CPU forward with poisoned allocations matches an unpoisoned run") {
  for (const OpInfo& row : all_rows()) {
    for (const OpSample& sample : row.samples) {
      for (DType dtype : {DType::f32, DType::f64}) {
        INFO("op '" << row.name << "' sample '" << sample.label << "' dtype " << dtype_name(dtype));
        try {
          std::vector<Tensor> inputs = make_inputs(row, sample, dtype, 11);
          Tensor reference = row.fn(inputs);
          Tensor poisoned;
          {
            PoisonGuard poison;
            poisoned = row.fn(inputs);
          }
          KILN_CHECK_CLOSE(poisoned, reference, 0.0, 0.0);
        } catch (const Error& error) {
          FAIL_CHECK("threw: " << std::string(error.what()));
        }
      }
    }
  }
}

TEST_CASE("op table: CUDA vs CPU parity, forward and backward [gpu]") {
  KILN_REQUIRE_GPU();
  int compared = 0;
  for (const OpInfo& row : all_rows()) {
    for (const OpSample& sample : row.samples) {
      for (DType dtype : row.parity_dtypes) {
        INFO("op '" << row.name << "' sample '" << sample.label << "' dtype " << dtype_name(dtype)
                    << (row.tolerance_note.empty() ? "" : " (" + row.tolerance_note + ")"));
        try {
          std::vector<Tensor> cpu_inputs = make_inputs(row, sample, dtype, 13);
          std::vector<Tensor> gpu_inputs;
          for (const Tensor& input : cpu_inputs) gpu_inputs.push_back(input.defined() ? input.cuda() : input);
          std::vector<int> grad_indices = row.differentiable ? grad_input_indices(row, cpu_inputs) : std::vector<int>{};
          for (int index : grad_indices) {
            cpu_inputs[index].requires_grad_(true);
            gpu_inputs[index].requires_grad_(true);
          }
          Tensor cpu_out = row.fn(cpu_inputs);
          Tensor gpu_out;
          {
            PoisonGuard poison;
            gpu_out = row.fn(gpu_inputs);
          }
          Tolerance tolerance = parity_tolerance(dtype);
          if (row.parity_rtol > 0) tolerance = {row.parity_rtol, row.parity_atol};
          if (auto it = row.parity_by_dtype.find(dtype); it != row.parity_by_dtype.end()) {
            tolerance = {it->second.first, it->second.second};
          }
          KILN_CHECK_CLOSE(gpu_out.cpu(), cpu_out, tolerance.rtol, tolerance.atol);
          if (!grad_indices.empty() && cpu_out.numel() > 0) {
            Tensor seed = default_inputs(OpSample{{cpu_out.shape()}, ""}, dtype, 17)[0];
            cpu_out.backward(seed);
            {
              PoisonGuard poison;
              gpu_out.backward(seed.cuda());
            }
            for (int index : grad_indices) {
              KILN_CHECK_CLOSE(gpu_inputs[index].grad().cpu(), cpu_inputs[index].grad(), tolerance.rtol * 4,
                               tolerance.atol * 4);
            }
          }
        } catch (const Error& error) {
          FAIL_CHECK("threw: " << std::string(error.what()));
        }
        ++compared;
      }
    }
  }
  MESSAGE("parity compared " << compared << " (op, sample, dtype) cases");
}

}  // namespace kiln::testing
