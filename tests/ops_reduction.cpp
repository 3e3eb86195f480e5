// Op-table rows of the reduction family (core/ops/reduction.cpp). Samples cover
// all dims, the last dim, a middle dim ((2,3,4) over dim 1), several dims with
// keepdim, an odd size ((7,1031): rows longer than a leaf block, not a
// multiple of any vector width) and empty tensors where the op is defined.
#include <limits>

#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;
using Dims = std::vector<int64_t>;

const OpSample k2d{{{4, 5}}, "2-d"};
const OpSample k3d{{{2, 3, 4}}, "3-d"};
const OpSample kOdd{{{7, 1031}}, "odd size (7,1031)"};
const OpSample kEmptyRows{{{0, 3}}, "empty (0,3)"};
const OpSample kScalar{{{}}, "0-d"};

OpInfo row(std::string name, std::function<Tensor(const Tensor&)> f, std::vector<OpSample> samples) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = [f = std::move(f)](const Inputs& in) { return f(in[0]); };
  info.samples = std::move(samples);
  return info;
}

}  // namespace

std::vector<OpInfo> reduction_op_infos() {
  std::vector<OpInfo> rows;
  const double inf = std::numeric_limits<double>::infinity();
  // --- sum
  rows.push_back(row("sum", [](const Tensor& x) { return sum(x); }, {k2d, k3d, kOdd, kEmptyRows, kScalar}));
  rows.push_back(row("sum last_dim", [](const Tensor& x) { return sum(x, {-1}); }, {k2d, k3d, kOdd}));
  rows.push_back(row("sum middle_dim", [](const Tensor& x) { return sum(x, {1}); },
                     {k3d, {{{3, 1031, 5}}, "odd middle (3,1031,5)"}}));
  rows.push_back(row("sum dim0", [](const Tensor& x) { return sum(x, {0}); }, {k2d, kOdd, kEmptyRows}));
  rows.push_back(row("sum dims_keepdim", [](const Tensor& x) { return sum(x, {0, -1}, true); }, {k2d, k3d}));
  // --- mean
  rows.push_back(row("mean", [](const Tensor& x) { return mean(x); }, {k2d, k3d, kOdd}));
  rows.push_back(row("mean middle_dim_keepdim", [](const Tensor& x) { return mean(x, {1}, true); }, {k3d}));
  rows.push_back(row("mean dims", [](const Tensor& x) { return mean(x, {0, 2}); }, {k3d}));
  // --- var
  rows.push_back(row("var", [](const Tensor& x) { return var(x); }, {k2d, k3d, kOdd}));
  rows.push_back(row("var biased_last_dim", [](const Tensor& x) { return var(x, {-1}, 0); }, {k2d, k3d, kOdd}));
  rows.push_back(row("var middle_dim_keepdim", [](const Tensor& x) { return var(x, {1}, 1, true); }, {k3d}));
  rows.push_back(row("var dims", [](const Tensor& x) { return var(x, {0, 2}); }, {k3d}));
  // --- amax, amin (ties split evenly; random inputs have none)
  rows.push_back(row("amax", [](const Tensor& x) { return amax(x); }, {k2d, k3d, kOdd, kScalar}));
  rows.push_back(row("amax middle_dim", [](const Tensor& x) { return amax(x, {1}); }, {k3d}));
  rows.push_back(row("amax dims_keepdim", [](const Tensor& x) { return amax(x, {0, -1}, true); }, {k2d, k3d}));
  rows.push_back(row("amin", [](const Tensor& x) { return amin(x, {-1}); }, {k2d, k3d, kOdd}));
  rows.push_back(row("amin dim0", [](const Tensor& x) { return amin(x, {0}); }, {k2d, k3d, {{{3, 0}}, "empty output: (3,0) over dim 0"}}));
  // --- max / min over everything and over a dim (values; the index is tested by argmax)
  rows.push_back(row("max", [](const Tensor& x) { return max(x); }, {k2d, k3d, kOdd}));
  rows.push_back(row("min", [](const Tensor& x) { return min(x); }, {k2d, k3d, kOdd}));
  rows.push_back(row("max dim", [](const Tensor& x) { return max(x, 1).values; }, {k2d, k3d, kOdd}));
  rows.push_back(row("max dim_keepdim", [](const Tensor& x) { return max(x, -1, true).values; }, {k2d, k3d}));
  rows.push_back(row("min dim", [](const Tensor& x) { return min(x, 0).values; }, {k2d, k3d, kOdd}));
  rows.push_back(row("max indices", [](const Tensor& x) { return max(x, 1).indices; }, {k2d, k3d, kOdd}));
  rows.back().differentiable = false;
  rows.push_back(row("argmax", [](const Tensor& x) { return argmax(x, -1); }, {k2d, k3d, kOdd}));
  rows.back().differentiable = false;
  rows.push_back(row("argmax middle_dim", [](const Tensor& x) { return argmax(x, 1, true); }, {k3d}));
  rows.back().differentiable = false;
  // --- norm
  rows.push_back(row("norm", [](const Tensor& x) { return norm(x); }, {k2d, k3d, kOdd, kEmptyRows}));
  rows.push_back(row("norm p1", [](const Tensor& x) { return norm(x, 1.0, {-1}); }, {k2d, k3d, kOdd}));
  rows.push_back(row("norm pinf", [inf](const Tensor& x) { return norm(x, inf, {1}); }, {k2d, k3d}));
  rows.push_back(row("norm p3_dims", [](const Tensor& x) { return norm(x, 3.0, {0, 2}, true); }, {k3d}));
  rows.push_back(row("norm p2_middle_dim", [](const Tensor& x) { return norm(x, 2.0, {1}); }, {k3d}));
  // --- cumsum
  rows.push_back(row("cumsum last_dim", [](const Tensor& x) { return cumsum(x, -1); }, {k2d, k3d, kOdd, kEmptyRows, kScalar}));
  rows.push_back(row("cumsum dim0", [](const Tensor& x) { return cumsum(x, 0); }, {k2d, k3d, kEmptyRows}));
  // --- topk (values; the indices come from the same kernel and gather the values)
  rows.push_back(row("topk last_dim", [](const Tensor& x) { return topk(x, 3, -1).values; },
                     {k2d, {{{3, 1031}}, "odd rows (3,1031)"}}));
  rows.push_back(row("topk smallest dim1", [](const Tensor& x) { return topk(x, 2, 1, /*largest=*/false).values; },
                     {k3d}));
  return rows;
}

}  // namespace kiln::testing
