#include "core/ops/broadcast.h"

#include <algorithm>

#include "core/autograd.h"

namespace kiln {

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    // Align trailing dims: a missing leading dim acts as size 1.
    const int64_t size_a = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    const int64_t size_b = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    KILN_CHECK(size_a == size_b || size_a == 1 || size_b == 1, op, ": shapes ", shape_str(a), " and ",
               shape_str(b), " cannot be broadcast together (dim ", i, ": ", size_a, " vs ", size_b, ")");
    out[i] = size_a == 1 ? size_b : size_a;
  }
  return out;
}

kernels::IterShape iter_shape(const Shape& shape) {
  KILN_CHECK(static_cast<int>(shape.size()) <= kernels::kMaxDims, "tensor with ", shape.size(),
             " dims (shape ", shape_str(shape), "): kiln kernels support at most ", kernels::kMaxDims);
  kernels::IterShape iter;
  iter.ndim = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) iter.sizes[i] = shape[i];
  return iter;
}

Shape broadcast_strides(const Tensor& tensor, const Shape& shape, const char* op) {
  const Shape& from = tensor.shape();
  KILN_CHECK(from.size() <= shape.size(), op, ": cannot broadcast shape ", shape_str(from), " to ",
             shape_str(shape));
  Shape strides(shape.size(), 0);
  const size_t lead = shape.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    KILN_CHECK(from[i] == shape[lead + i] || from[i] == 1, op, ": cannot broadcast shape ", shape_str(from),
               " to ", shape_str(shape));
    strides[lead + i] = from[i] == 1 ? 0 : tensor.strides()[i];
  }
  return strides;
}

kernels::Operand operand(const Tensor& tensor, const Shape& out_shape, const char* op) {
  KILN_CHECK(static_cast<int>(out_shape.size()) <= kernels::kMaxDims, op, ": tensor with ", out_shape.size(),
             " dims (shape ", shape_str(out_shape), "): kiln kernels support at most ", kernels::kMaxDims);
  const Shape strides = broadcast_strides(tensor, out_shape, op);
  kernels::Operand result;
  result.data = tensor.data_ptr();
  result.dtype = tensor.dtype();
  for (size_t i = 0; i < strides.size(); ++i) result.strides[i] = strides[i];
  return result;
}

void iterate_in_memory_order(kernels::IterShape& shape, kernels::Operand* operands, int count) {
  const int ndim = shape.ndim;
  const int64_t* out_strides = operands[0].strides;
  bool in_order = true;  // the common case (a row-major output): nothing to do
  for (int d = 1; d < ndim && in_order; ++d) in_order = out_strides[d - 1] >= out_strides[d];
  if (in_order) return;
  int order[kernels::kMaxDims];
  for (int d = 0; d < ndim; ++d) order[d] = d;
  // Stable: ties (size-1 dims, whose strides say nothing) keep their order;
  // coalesce drops them anyway.
  std::stable_sort(order, order + ndim, [&](int a, int b) { return out_strides[a] > out_strides[b]; });
  const kernels::IterShape before = shape;
  for (int d = 0; d < ndim; ++d) shape.sizes[d] = before.sizes[order[d]];
  for (int k = 0; k < count; ++k) {
    int64_t strides[kernels::kMaxDims];
    for (int d = 0; d < ndim; ++d) strides[d] = operands[k].strides[order[d]];
    for (int d = 0; d < ndim; ++d) operands[k].strides[d] = strides[d];
  }
}

Tensor empty_in_layout_of(const Tensor& like, const Shape& shape, const TensorOptions& options) {
  if (like.shape() == shape && is_channels_last(like)) return empty_strided(shape, channels_last_strides(shape), options);
  return empty(shape, options);
}

void check_defined(const Tensor& tensor, const char* op, const char* what) {
  KILN_CHECK(tensor.defined(), op, ": ", what, " is an undefined tensor");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.device() == b.device(), op, ": expected both tensors on the same device, got ", shape_str(a.shape()),
             " on ", a.device(), " and ", shape_str(b.shape()), " on ", b.device());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  KILN_CHECK(a.dtype() == b.dtype(), op, ": expected both tensors to have the same dtype, got ",
             shape_str(a.shape()), " ", dtype_name(a.dtype()), " and ", shape_str(b.shape()), " ",
             dtype_name(b.dtype()), " (cast one of them first)");
}

void check_inplace_target(const Tensor& self, const char* op) {
  check_defined(self, op, "self");
  KILN_CHECK(!(grad_mode_enabled() && self.requires_grad()), op,
             ": in-place write to a tensor that requires grad",
             self.name().empty() ? std::string() : " ('" + self.name() + "')",
             "; use the out-of-place op, or NoGradGuard for updates outside autograd");
  for (int64_t d = 0; d < self.dim(); ++d) {
    KILN_CHECK(self.strides()[d] != 0 || self.shape()[d] <= 1, op,
               ": in-place write to a tensor of shape ", shape_str(self.shape()), " with strides ",
               shape_str(self.strides()), " where several elements share one memory location (an expanded "
               "tensor); clone() it first");
  }
}

}  // namespace kiln
