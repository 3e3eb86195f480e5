// Reductions: sum, mean, var, amax/amin, max/min (values + indices), argmax,
// norm, all — forward and backward side by side.
//
// Every reduction is planned as one kernel call over a dense (outer, reduced,
// inner) buffer: the input is viewed in its memory order (no copy for a
// contiguous or permuted tensor), size-1 dims are dropped, and if the reduced
// dims do not form one block they are moved last by a copy. Outputs are
// allocated dense in the same memory order, so a reduction of a permuted
// tensor returns a permuted (non-contiguous) result, as torch does. Backward
// kernels write the input gradient in that same layout.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "kernels/reduction.h"

namespace kiln {

namespace {

using kernels::ReduceGradKind;
using kernels::ReduceKind;

struct ReducePlan {
  std::vector<int64_t> order;  // logical dims in memory order of `dense`
  Tensor dense;                // x.permute(order), dense: a view of x or a copy
  std::vector<bool> reduced_dim;
  int64_t outer = 1, reduced = 1, inner = 1;
  Shape input_shape;
  Shape keep_shape;  // input_shape with the reduced dims as 1
  Shape out_shape;   // keep_shape, without the reduced dims unless keepdim
  bool keepdim = false;
  Device device;
};

// Strides of `shape` that make its dims, taken in `order`, row-major dense.
Shape dense_strides_in_order(const Shape& shape, const std::vector<int64_t>& order) {
  Shape strides(shape.size(), 1);
  int64_t stride = 1;
  for (size_t i = order.size(); i-- > 0;) {
    strides[order[i]] = stride;
    stride *= std::max<int64_t>(shape[order[i]], 1);
  }
  return strides;
}

// The memory order of x's dims when some permutation of x is dense, else empty.
std::vector<int64_t> dense_order(const Tensor& x) {
  const int64_t n = x.dim();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (x.is_contiguous()) return order;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    // Size-1 dims keep their place relative to each other; their stride is irrelevant.
    const int64_t sa = x.shape()[a] == 1 ? 0 : x.strides()[a], sb = x.shape()[b] == 1 ? 0 : x.strides()[b];
    return sa > sb;
  });
  if (x.permute(order).is_contiguous()) return order;
  return {};
}

ReducePlan plan_reduce(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  KILN_CHECK(x.defined(), op, ": the input tensor is undefined");
  NoGradGuard no_grad;  // permute/contiguous below are internal, not part of the graph
  ReducePlan plan;
  plan.device = x.device();
  plan.keepdim = keepdim;
  plan.input_shape = x.shape();
  const int64_t ndim = x.dim();
  plan.reduced_dim.assign(ndim, dims.empty());
  std::vector<bool> seen(std::max<int64_t>(ndim, 1), false);
  for (int64_t dim : dims) {
    const int64_t d = wrap_dim(dim, ndim, op);
    KILN_CHECK(!seen[d], op, ": dim ", d, " appears more than once in the dims ", shape_str(dims),
               " for a tensor of shape ", shape_str(x.shape()));
    seen[d] = true;
    if (ndim > 0) plan.reduced_dim[d] = true;
  }
  plan.keep_shape = x.shape();
  for (int64_t d = 0; d < ndim; ++d) {
    if (plan.reduced_dim[d]) plan.keep_shape[d] = 1;
    if (keepdim || !plan.reduced_dim[d]) plan.out_shape.push_back(plan.keep_shape[d]);
  }

  plan.order = dense_order(x);
  Tensor source = x;
  if (plan.order.empty() && ndim > 0) {
    source = x.contiguous();
    plan.order.resize(ndim);
    std::iota(plan.order.begin(), plan.order.end(), 0);
  }
  // Positions (in memory order) of reduced dims that matter (size != 1).
  auto position_of_reduced = [&](bool first) {
    int64_t found = -1;
    for (int64_t i = 0; i < ndim; ++i) {
      const int64_t d = plan.order[i];
      if (plan.reduced_dim[d] && x.shape()[d] != 1) {
        found = i;
        if (first) break;
      }
    }
    return found;
  };
  int64_t first = position_of_reduced(true), last = position_of_reduced(false);
  bool split = false;
  for (int64_t i = first; i >= 0 && i <= last; ++i) {
    const int64_t d = plan.order[i];
    if (!plan.reduced_dim[d] && x.shape()[d] != 1) split = true;
  }
  if (split) {
    // Kept dims first, reduced dims last, both in memory order; one copy.
    std::vector<int64_t> order;
    for (int64_t d : plan.order) {
      if (!plan.reduced_dim[d]) order.push_back(d);
    }
    for (int64_t d : plan.order) {
      if (plan.reduced_dim[d]) order.push_back(d);
    }
    plan.order = order;
    plan.dense = source.permute(order).contiguous();
    first = position_of_reduced(true);
    last = ndim - 1;
  } else {
    plan.dense = ndim > 0 ? source.permute(plan.order) : source;
  }
  // (An empty tensor is never read; Tensor::is_contiguous may say no for one.)
  KILN_ASSERT(plan.dense.numel() == 0 || plan.dense.is_contiguous(), op, ": reduction plan is not dense");
  if (first < 0) {
    plan.outer = x.numel();
  } else {
    for (int64_t i = 0; i < ndim; ++i) {
      const int64_t size = x.shape()[plan.order[i]];
      (i < first ? plan.outer : i <= last ? plan.reduced : plan.inner) *= size;
    }
  }
  return plan;
}

// A new output of the plan's result shape, dense in the plan's memory order.
Tensor new_output(const ReducePlan& plan, DType dtype) {
  const Shape keep_strides = dense_strides_in_order(plan.keep_shape, plan.order);
  if (plan.keepdim) return empty_strided(plan.keep_shape, keep_strides, {.dtype = dtype, .device = plan.device});
  Shape strides;
  for (size_t d = 0; d < plan.keep_shape.size(); ++d) {
    if (!plan.reduced_dim[d]) strides.push_back(keep_strides[d]);
  }
  return empty_strided(plan.out_shape, strides, {.dtype = dtype, .device = plan.device});
}

// A dense (outer, inner) buffer for per-output values, not visible to the user.
Tensor new_buffer(const ReducePlan& plan, DType dtype) {
  return empty({plan.outer * plan.inner}, {.dtype = dtype, .device = plan.device});
}

// `t` reshaped to `shape` (expand for a 0-d tensor: Tensor::view cannot yet add
// size-1 dims to a 0-d tensor).
Tensor reshaped(const Tensor& t, const Shape& shape) { return t.dim() == 0 ? t.expand(shape) : t.reshape(shape); }

// `t` as a 1-d tensor of its numel elements.
Tensor flat(const Tensor& t) { return t.dim() == 0 ? t.expand({1}) : t.reshape({t.numel()}); }

// The gradient of the output as a dense (outer, inner) buffer in plan order.
Tensor dense_grad(const ReducePlan& plan, const Tensor& grad) {
  Tensor g = reshaped(grad, plan.keep_shape);
  if (!plan.order.empty()) g = g.permute(plan.order);
  return g.contiguous();
}

// A new input gradient, dense in plan order (matching plan.dense).
Tensor new_input_grad(const ReducePlan& plan, DType dtype) {
  return empty_strided(plan.input_shape, dense_strides_in_order(plan.input_shape, plan.order),
                       {.dtype = dtype, .device = plan.device});
}

kernels::ReduceArgs reduce_args(const ReducePlan& plan, ReduceKind kind, const Tensor& out) {
  kernels::ReduceArgs args;
  args.kind = kind;
  args.in_dtype = plan.dense.dtype();
  args.out_dtype = out.dtype();
  args.in = plan.dense.data_ptr();
  args.out = out.data_ptr();
  args.outer = plan.outer;
  args.reduced = plan.reduced;
  args.inner = plan.inner;
  args.device = plan.device.index;
  return args;
}

void launch(const kernels::ReduceArgs& args, Device device) {
  if (args.outer * args.inner == 0) return;
  if (device.is_cpu()) {
    kernels::reduce_cpu(args);
    return;
  }
  const int64_t bytes = kernels::reduce_cuda_workspace_bytes(args);
  Tensor workspace;
  if (bytes > 0) workspace = empty({bytes}, {.dtype = DType::u8, .device = device});
  kernels::reduce_cuda(args, workspace.defined() ? workspace.data_ptr() : nullptr, launch_on(device, "reduction").stream);
}

// Runs a reduce-gradient kernel; x is the plan's dense input (may be undefined when unused).
Tensor launch_grad(const ReducePlan& plan, kernels::ReduceGradArgs args, const Tensor& x, const Tensor& grad) {
  Tensor g = dense_grad(plan, grad);
  Tensor dx = new_input_grad(plan, g.dtype());
  if (dx.numel() == 0) return dx;
  args.dtype = g.dtype();
  args.x = x.defined() ? x.data_ptr() : nullptr;
  args.grad = g.data_ptr();
  args.dx = dx.data_ptr();
  args.outer = plan.outer;
  args.reduced = plan.reduced;
  args.inner = plan.inner;
  if (plan.device.is_cpu()) {
    kernels::reduce_grad_cpu(args);
  } else {
    kernels::reduce_grad_cuda(args, launch_on(plan.device, "reduction backward").stream);
  }
  return dx;
}

// The plan without its tensor, for capture by a backward function.
ReducePlan shape_only(const ReducePlan& plan) {
  ReducePlan copy = plan;
  copy.dense = Tensor();
  return copy;
}

void check_floating(const Tensor& x, const char* op) {
  KILN_CHECK(is_floating(x.dtype()), op, ": expected a floating input (float32, float64, float16, bfloat16), got ",
             dtype_name(x.dtype()), " of shape ", shape_str(x.shape()));
}

void check_nonempty_reduction(const ReducePlan& plan, const char* op) {
  KILN_CHECK(plan.reduced > 0 || plan.outer * plan.inner == 0, op,
             ": cannot reduce over a dim of size 0 (input shape ", shape_str(plan.input_shape),
             "): the result has no identity");
}

// Counts, per output, the elements equal to the Acc-typed `value` buffer.
Tensor count_equal(const ReducePlan& plan, const Tensor& dense, const Tensor& value, ReduceKind kind) {
  Tensor count = new_buffer(plan, value.dtype());
  ReducePlan p = plan;
  p.dense = dense;
  kernels::ReduceArgs args = reduce_args(p, kind, count);
  args.aux = value.data_ptr();
  launch(args, plan.device);
  return count;
}

// amax / amin / max() / min(): values only; the gradient is split evenly among ties.
Tensor extremum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, bool is_max, const char* op) {
  ReducePlan plan = plan_reduce(x, dims, keepdim, op);
  check_nonempty_reduction(plan, op);
  Tensor out = new_output(plan, x.dtype());
  launch(reduce_args(plan, is_max ? ReduceKind::amax : ReduceKind::amin, out), plan.device);
  if (is_floating(x.dtype()) && autograd::any_requires_grad({&x})) {
    // The value buffer in Acc, dense in plan order.
    Tensor value;
    {
      NoGradGuard no_grad;
      value = flat(dense_grad(plan, out).to(kernels::reduce_acc_dtype(x.dtype())));
    }
    autograd::record(op, {x}, {out},
                     [plan = shape_only(plan), sx = autograd::SavedTensor(plan.dense, op),
                      sv = autograd::SavedTensor(value, op)](const autograd::TensorList& g) -> autograd::TensorList {
                       Tensor dense = sx.unpack(), v = sv.unpack();
                       Tensor count = count_equal(plan, dense, v, ReduceKind::count_equal);
                       kernels::ReduceGradArgs args;
                       args.kind = ReduceGradKind::equal;
                       args.aux = v.data_ptr();
                       args.count = count.data_ptr();
                       return {launch_grad(plan, args, dense, g[0])};
                     });
  }
  return out;
}

ValuesIndices extremum_dim(const Tensor& x, int64_t dim, bool keepdim, bool is_max, const char* op) {
  ReducePlan plan = plan_reduce(x, {dim}, keepdim, op);
  check_nonempty_reduction(plan, op);
  ValuesIndices result{new_output(plan, x.dtype()), new_output(plan, DType::i64)};
  kernels::ReduceArgs args = reduce_args(plan, is_max ? ReduceKind::max_index : ReduceKind::min_index, result.values);
  args.indices = static_cast<int64_t*>(result.indices.data_ptr());
  launch(args, plan.device);
  if (is_floating(x.dtype()) && autograd::any_requires_grad({&x})) {
    Tensor indices;
    {
      NoGradGuard no_grad;
      indices = dense_grad(plan, result.indices);
    }
    autograd::record(op, {x}, {result.values},
                     [plan = shape_only(plan), si = autograd::SavedTensor(indices, op)](
                         const autograd::TensorList& g) -> autograd::TensorList {
                       Tensor idx = si.unpack();
                       kernels::ReduceGradArgs args;
                       args.kind = ReduceGradKind::index;
                       args.indices = static_cast<const int64_t*>(idx.data_ptr());
                       return {launch_grad(plan, args, Tensor(), g[0])};
                     });
  }
  return result;
}

}  // namespace

// ---------------------------------------------------------------- sum, mean

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return sum(to(x), dims, keepdim);
  ReducePlan plan = plan_reduce(x, dims, keepdim, "sum");
  const DType out_dtype = is_floating(x.dtype()) ? x.dtype() : DType::i64;
  Tensor out = new_output(plan, out_dtype);
  launch(reduce_args(plan, ReduceKind::sum, out), plan.device);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("sum", {x}, {out},
                     [plan = shape_only(plan)](const autograd::TensorList& g) -> autograd::TensorList {
                       return {reshaped(g[0], plan.keep_shape).expand(plan.input_shape)};
                     });
  }
  return out;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return mean(to(x), dims, keepdim);
  check_floating(x, "mean");
  ReducePlan plan = plan_reduce(x, dims, keepdim, "mean");
  Tensor out = new_output(plan, x.dtype());
  launch(reduce_args(plan, ReduceKind::mean, out), plan.device);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("mean", {x}, {out},
                     [plan = shape_only(plan)](const autograd::TensorList& g) -> autograd::TensorList {
                       kernels::ReduceGradArgs args;
                       args.kind = ReduceGradKind::scale;
                       args.scale = 1.0 / static_cast<double>(plan.reduced);
                       return {launch_grad(plan, args, Tensor(), g[0])};
                     });
  }
  return out;
}

// ---------------------------------------------------------------- var

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  check_floating(x, "var");
  KILN_CHECK(correction >= 0, "var: correction must be non-negative, got ", correction);
  ReducePlan plan = plan_reduce(x, dims, keepdim, "var");
  Tensor out = new_output(plan, x.dtype());
  Tensor mean_buffer = new_buffer(plan, kernels::reduce_acc_dtype(x.dtype()));
  kernels::ReduceArgs args = reduce_args(plan, ReduceKind::var, out);
  args.aux = mean_buffer.data_ptr();
  args.correction = correction;
  launch(args, plan.device);
  if (autograd::any_requires_grad({&x})) {
    autograd::record("var", {x}, {out},
                     [plan = shape_only(plan), correction, sx = autograd::SavedTensor(plan.dense, "var"),
                      sm = autograd::SavedTensor(mean_buffer, "var")](const autograd::TensorList& g)
                         -> autograd::TensorList {
                       Tensor dense = sx.unpack(), m = sm.unpack();
                       kernels::ReduceGradArgs args;
                       args.kind = ReduceGradKind::var;
                       args.aux = m.data_ptr();
                       args.scale = 2.0 / static_cast<double>(std::max<int64_t>(plan.reduced - correction, 0));
                       return {launch_grad(plan, args, dense, g[0])};
                     });
  }
  return out;
}

// ---------------------------------------------------------------- amax, amin, max, min, argmax

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(x, dims, keepdim, true, "amax");
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extremum(x, dims, keepdim, false, "amin");
}
Tensor max(const Tensor& x) { return extremum(x, {}, false, true, "max"); }
Tensor min(const Tensor& x) { return extremum(x, {}, false, false, "min"); }

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return extremum_dim(x, dim, keepdim, true, "max"); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) { return extremum_dim(x, dim, keepdim, false, "min"); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  NoGradGuard no_grad;
  return extremum_dim(x, dim, keepdim, true, "argmax").indices;
}

// ---------------------------------------------------------------- norm

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::float32, {&x})) return norm(to(x), p, dims, keepdim);
  check_floating(x, "norm");
  KILN_CHECK(!std::isnan(p), "norm: p must not be NaN");
  ReducePlan plan = plan_reduce(x, dims, keepdim, "norm");
  if (std::isinf(p)) check_nonempty_reduction(plan, "norm");
  Tensor out = new_output(plan, x.dtype());
  kernels::ReduceArgs args = reduce_args(plan, ReduceKind::norm, out);
  args.p = p;
  launch(args, plan.device);
  if (autograd::any_requires_grad({&x})) {
    Tensor value;
    {
      NoGradGuard no_grad;
      value = flat(dense_grad(plan, out).to(kernels::reduce_acc_dtype(x.dtype())));
    }
    autograd::record("norm", {x}, {out},
                     [plan = shape_only(plan), p, sx = autograd::SavedTensor(plan.dense, "norm"),
                      sv = autograd::SavedTensor(value, "norm")](const autograd::TensorList& g)
                         -> autograd::TensorList {
                       Tensor dense = sx.unpack(), v = sv.unpack();
                       kernels::ReduceGradArgs args;
                       args.kind = ReduceGradKind::norm;
                       args.p = p;
                       args.aux = v.data_ptr();
                       Tensor count;
                       if (std::isinf(p)) {
                         count = count_equal(plan, dense, v, ReduceKind::count_abs_equal);
                         args.count = count.data_ptr();
                       }
                       return {launch_grad(plan, args, dense, g[0])};
                     });
  }
  return out;
}

// ---------------------------------------------------------------- all

Tensor all(const Tensor& x) {
  ReducePlan plan = plan_reduce(x, {}, false, "all");
  Tensor out = new_output(plan, DType::b8);
  launch(reduce_args(plan, ReduceKind::all, out), plan.device);
  return out;
}

}  // namespace kiln
