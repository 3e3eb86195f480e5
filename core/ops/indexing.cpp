// Indexing ops: index_select, gather, scatter_add, embedding (torch semantics),
// forward and backward side by side. Kernels: kernels/indexing.h.
//
// index_select and embedding run the gather kernel with the 1-D index
// expanded over the other dims (stride 0), so every op here is a gather or a
// scatter-add along one dim. Index tensors are int32 or int64; indices must
// lie in [0, size) (no negative indices, as in torch).
//
// Out-of-range indices: on the CPU the op throws naming the op, the dim, the
// bad value and the size. On CUDA a host check would need a sync, so the
// kernel skips the element (gather writes 0), records the first bad value in a
// device flag, and the forward stays asynchronous; with anomaly mode on
// (set_detect_anomaly, a debug mode that reads the device anyway) the op reads
// the flag right after the launch and throws the CPU's message.
//
// Determinism: the CPU scatter is deterministic. On CUDA, the backward of
// index_select/embedding always uses the sorted (deterministic) index_add
// with float accumulation; gather's backward and scatter_add use atomics for
// float32/float64 unless deterministic_algorithms_enabled(), and the sorted
// path for float16/bfloat16 (float accumulation, one rounding per element).
// Integer scatters use atomics, which are exact. No op here needs
// alert_not_deterministic.
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/cuda/runtime.h"
#include "kernels/indexing.h"

namespace kiln {

namespace {

void check_index(const Tensor& index, const Tensor& x, const char* op) {
  check_defined(index, op, "index");
  KILN_CHECK(index.dtype() == DType::i32 || index.dtype() == DType::i64, op,
             ": expected an index tensor of dtype int32 or int64, got ", dtype_name(index.dtype()), " (shape ",
             shape_str(index.shape()), ")");
  check_same_device(x, index, op);
}

void check_scatter_dtype(DType dtype, const char* op) {
  KILN_CHECK(is_floating(dtype) || dtype == DType::i32 || dtype == DType::i64, op, ": unsupported dtype ",
             dtype_name(dtype), " (expected a floating dtype, int32 or int64)");
}

[[noreturn]] void throw_index_error(const char* op, int64_t dim, const kernels::IndexError& error) {
  KILN_THROW(op, ": index ", error.value, " is out of range for dim ", dim, " with size ", error.size,
             " (expected indices in [0, ", error.size, "))");
}

// See the file comment: only anomaly mode reads the device's error flag.
void check_cuda_indices(const char* op, int64_t dim, const Tensor& like) {
  if (!anomaly_mode_enabled()) return;
  const kernels::IndexError error = kernels::index_error_cuda(like.device().index, launch_on(like, op).stream);
  // The device's slot holds the first bad index of any gather/scatter since it
  // was last read, which may be an op that ran before anomaly mode was on.
  KILN_CHECK(!error.found, op, ": index ", error.value, " is out of range for size ", error.size,
             " (expected indices in [0, ", error.size, "); the first out-of-range index any CUDA gather/scatter on ",
             like.device(), " recorded since the last check: this op (dim ", dim, ") or one before it)");
}

// Kernel arguments over index's shape; data, index and values have its rank.
kernels::IndexArgs index_args(const Tensor& data, int64_t dim, const Tensor& index, const Tensor& values,
                              const char* op) {
  kernels::IndexArgs args;
  args.shape = iter_shape(index.shape());
  args.dim = static_cast<int>(dim);
  args.data = operand(data, data.shape(), op);
  args.data_dim_size = data.shape()[dim];
  args.index = operand(index, index.shape(), op);
  args.values = operand(values, values.shape(), op);
  return args;
}

// values[c] = data[c with c[dim] = index[c]] into a new tensor of index's shape.
Tensor gather_into_new(const char* op, const Tensor& data, int64_t dim, const Tensor& index) {
  Tensor out = empty(index.shape(), TensorOptions{.dtype = data.dtype(), .device = data.device()});
  if (out.numel() == 0) return out;
  const kernels::IndexArgs args = index_args(data, dim, index, out, op);
  if (data.is_cpu()) {
    const kernels::IndexError error = kernels::gather_cpu(args);
    if (error.found) throw_index_error(op, dim, error);
  } else {
    kernels::gather_cuda(args, launch_on(data, op).stream);
    check_cuda_indices(op, dim, data);
  }
  return out;
}

// data[c with c[dim] = index[c]] += values[c] for c over index's shape; `data`
// is a fresh contiguous tensor that nothing else refers to.
void scatter_add_into(const char* op, const Tensor& data, int64_t dim, const Tensor& index, const Tensor& values) {
  if (index.numel() == 0) return;
  const DType dtype = data.dtype();
  if (data.is_cpu()) {
    if (dtype == DType::f16 || dtype == DType::bf16) {
      // Accumulate in float32 (one rounding per element, as the CUDA sorted path).
      Tensor data32 = data.to(DType::f32), values32 = values.to(DType::f32);
      scatter_add_into(op, data32, dim, index, values32);
      Tensor(data).copy_(data32);
      return;
    }
    const kernels::IndexError error = kernels::scatter_add_cpu(index_args(data, dim, index, values, op));
    if (error.found) throw_index_error(op, dim, error);
    return;
  }
  const kernels::IndexArgs args = index_args(data, dim, index, values, op);
  const bool sorted = is_floating(dtype) && (deterministic_algorithms_enabled() || dtype_size(dtype) == 2);
  if (sorted) {
    const size_t bytes = kernels::scatter_add_sorted_workspace_bytes(index.numel());
    const cuda::DeviceScope scope(data.device().index, op);
    auto workspace = allocate_cuda(bytes, data.device().index, scope.stream);
    kernels::scatter_add_sorted_cuda(args, data.numel(), workspace.get(), bytes, scope.stream);
  } else {
    kernels::scatter_add_cuda(args, launch_on(data, op).stream);
  }
  check_cuda_indices(op, dim, data);
}

// A tensor of `shape` whose leading block of index's shape holds `block` and
// the rest zeros (scatter_add's src may be larger than its index).
Tensor pad_to(const Tensor& block, const Shape& shape) {
  if (block.shape() == shape) return block;
  Tensor out = zeros(shape, TensorOptions{.dtype = block.dtype(), .device = block.device()});
  Tensor region = out;
  for (int64_t d = 0; d < block.dim(); ++d) region = region.narrow(d, 0, block.shape()[d]);
  region.copy_(block);
  return out;
}

// The 1-D index of index_select viewed over out_shape (stride 0 off `dim`).
Tensor expand_index(const Tensor& index, int64_t dim, const Shape& out_shape) {
  Shape shape(out_shape.size(), 1);
  shape[dim] = index.numel();
  return index.reshape(shape).expand(out_shape);
}

// Backward of index_select/embedding: rows of grad added into zeros at index.
// Floating gradients take the row kernels: on the CPU one pass that writes
// every element (no zero fill first), on CUDA the sorted, deterministic add.
Tensor index_add_backward(const char* op, const Tensor& grad, const Shape& input_shape, int64_t dim,
                          const Tensor& index) {
  const TensorOptions options{.dtype = grad.dtype(), .device = grad.device()};
  if (!is_floating(grad.dtype()) || grad.numel() == 0) {
    Tensor dx = zeros(input_shape, options);
    if (grad.numel() > 0) scatter_add_into(op, dx, dim, expand_index(index, dim, grad.shape()), grad);
    return dx;
  }
  Tensor dx = grad.is_cpu() ? empty(input_shape, options) : zeros(input_shape, options);
  const Tensor dense = grad.contiguous(), flat_index = index.reshape({-1}).contiguous();
  kernels::IndexAddArgs args;
  args.data = dx.data_ptr();
  args.values = dense.data_ptr();
  args.index = flat_index.data_ptr();
  args.dtype = grad.dtype();
  args.index_dtype = flat_index.dtype();
  for (int64_t d = 0; d < dim; ++d) args.outer *= input_shape[d];
  for (size_t d = dim + 1; d < input_shape.size(); ++d) args.inner *= input_shape[d];
  args.count = flat_index.numel();
  args.data_dim_size = input_shape[dim];
  if (grad.is_cpu()) {
    const kernels::IndexError error = kernels::index_add_rows_cpu(args);
    if (error.found) throw_index_error(op, dim, error);
    return dx;
  }
  const size_t bytes = kernels::index_add_sorted_workspace_bytes(args.count);
  const cuda::DeviceScope scope(grad.device().index, op);
  auto workspace = allocate_cuda(bytes, grad.device().index, scope.stream);
  kernels::index_add_sorted_cuda(args, workspace.get(), bytes, scope.stream);
  check_cuda_indices(op, dim, grad);
  return dx;
}

Tensor index_select_impl(const char* op, const Tensor& x, int64_t dim, const Tensor& index) {
  check_defined(x, op);
  check_index(index, x, op);
  KILN_CHECK(index.dim() <= 1, op, ": expected a 0-D or 1-D index, got shape ", shape_str(index.shape()));
  if (x.dim() == 0) {
    wrap_dim(dim, 0, op);
    return index_select_impl(op, x.reshape({1}), 0, index).reshape(index.shape());
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  Shape out_shape = x.shape();
  out_shape[d] = index.numel();
  Tensor out = gather_into_new(op, x, d, expand_index(index, d, out_shape));
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op, {x}, {out},
                     [op, d, input_shape = x.shape(), saved_index = autograd::SavedTensor(index, op)](
                         const autograd::TensorList& grads) -> autograd::TensorList {
                       return {index_add_backward(op, grads[0], input_shape, d, saved_index.unpack())};
                     });
  }
  return out;
}

// Checks index.size(d) <= limit.size(d) for every d (but `skip`); names `op`.
void check_index_fits(const Tensor& index, const Tensor& limit, int64_t skip, const char* what, const char* op) {
  for (int64_t d = 0; d < index.dim(); ++d) {
    KILN_CHECK(d == skip || index.shape()[d] <= limit.shape()[d], op, ": index shape ", shape_str(index.shape()),
               " is larger than the ", what, " shape ", shape_str(limit.shape()), " at dim ", d,
               skip >= 0 ? " (only the indexed dim " + std::to_string(skip) + " may be larger)" : std::string());
  }
}

void check_same_rank(const Tensor& index, const Tensor& x, const char* what, const char* op) {
  KILN_CHECK(index.dim() == x.dim(), op, ": index (shape ", shape_str(index.shape()),
             ") must have the same number of dims as the ", what, " (shape ", shape_str(x.shape()), ")");
}

}  // namespace

// ---------------------------------------------------------------- index_select

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return index_select_impl("index_select", x, dim, index);
}

// ---------------------------------------------------------------- embedding

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_defined(weight, "embedding", "weight");
  KILN_CHECK(weight.dim() == 2, "embedding: expected a 2-D weight (num_embeddings, embedding_dim), got shape ",
             shape_str(weight.shape()));
  check_index(indices, weight, "embedding");
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  return index_select_impl("embedding", weight, 0, indices.reshape({-1})).view(out_shape);
}

// ---------------------------------------------------------------- gather

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  check_defined(x, op);
  check_index(index, x, op);
  check_same_rank(index, x, "input", op);
  if (x.dim() == 0) {
    wrap_dim(dim, 0, op);
    return gather(x.reshape({1}), 0, index.reshape({1})).reshape({});
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index_fits(index, x, d, "input", op);
  Tensor out = gather_into_new(op, x, d, index);
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op, {x}, {out},
                     [op, d, input_shape = x.shape(), saved_index = autograd::SavedTensor(index, op)](
                         const autograd::TensorList& grads) -> autograd::TensorList {
                       const Tensor& grad = grads[0];
                       Tensor dx = zeros(input_shape, TensorOptions{.dtype = grad.dtype(), .device = grad.device()});
                       scatter_add_into(op, dx, d, saved_index.unpack(), grad);
                       return {dx};
                     });
  }
  return out;
}

// ---------------------------------------------------------------- scatter_add

Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  check_defined(x, op);
  check_defined(src, op, "src");
  check_index(index, x, op);
  check_same_device(x, src, op);
  check_same_dtype(x, src, op);
  check_scatter_dtype(x.dtype(), op);
  check_same_rank(index, x, "input", op);
  check_same_rank(index, src, "src", op);
  if (x.dim() == 0) {
    wrap_dim(dim, 0, op);
    return scatter_add(x.reshape({1}), 0, index.reshape({1}), src.reshape({1})).reshape({});
  }
  const int64_t d = wrap_dim(dim, x.dim(), op);
  check_index_fits(index, x, d, "input", op);
  check_index_fits(index, src, -1, "src", op);
  Tensor out = empty(x.shape(), TensorOptions{.dtype = x.dtype(), .device = x.device()});
  out.copy_(x);
  scatter_add_into(op, out, d, index, src);
  if (autograd::any_requires_grad({&x, &src})) {
    autograd::record(op, {x, src}, {out},
                     [op, d, need_x = x.requires_grad(), need_src = src.requires_grad(), src_shape = src.shape(),
                      saved_index = autograd::SavedTensor(index, op)](
                         const autograd::TensorList& grads) -> autograd::TensorList {
                       const Tensor& grad = grads[0];
                       Tensor dsrc;
                       if (need_src) dsrc = pad_to(gather_into_new(op, grad, d, saved_index.unpack()), src_shape);
                       return {need_x ? grad : Tensor(), dsrc};
                     });
  }
  return out;
}

}  // namespace kiln
