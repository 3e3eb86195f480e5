// Matrix products: matmul (torch.matmul semantics), mm, bmm, linear — forward
// and backward side by side.
//
// Every product is one kernels::gemm_* call. An operand reaches the kernel
// without a copy when its last two dims are row-major or column-major (a
// transposed matrix is a flag) and its batch dims collapse to one stride (0
// for a broadcast operand); only other layouts are copied. Backward:
//   dA = dC @ B^T,  dB = A^T @ dC  (the transposes are flags, not copies);
// a batch-broadcast operand is an expand() view whose backward sums the
// gradient back (sum_to). linear is one GEMM with the bias fused (cuBLASLt
// epilogue on CUDA, C pre-filled on the CPU).
#include <atomic>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/linalg.h"

namespace kiln {

namespace {

std::atomic<bool> tf32_allowed{false};

// The last two dims (rows, cols) with strides (row_stride, col_stride) as a
// GEMM operand: row-major (col stride 1) or column-major (row stride 1, the
// transpose flag). Size-1 dims accept any stride. False for other layouts.
bool matrix_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, kernels::GemmMatrix* out) {
  if ((cols <= 1 || col_stride == 1) && (rows <= 1 || row_stride >= std::max<int64_t>(cols, 1))) {
    out->ld = rows <= 1 ? std::max<int64_t>(cols, 1) : row_stride;
    out->transposed = false;
    return true;
  }
  if ((rows <= 1 || row_stride == 1) && (cols <= 1 || col_stride >= std::max<int64_t>(rows, 1))) {
    out->ld = cols <= 1 ? std::max<int64_t>(rows, 1) : col_stride;
    out->transposed = true;
    return true;
  }
  return false;
}

// One stride for all batch dims (all but the last two), or false when they
// do not collapse. A broadcast (stride 0) batch collapses to stride 0.
bool batch_stride(const Tensor& t, int64_t* stride) {
  *stride = 0;
  bool found = false;
  int64_t expected = 0;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    const int64_t size = t.shape()[d], step = t.strides()[d];
    if (size == 1) continue;
    if (!found) {
      *stride = step;
      found = true;
    } else if (step != expected) {
      return false;
    }
    expected = step * size;
  }
  return true;
}

bool describe(const Tensor& t, kernels::GemmMatrix* out) {
  if (!matrix_layout(t.size(-2), t.size(-1), t.stride(-2), t.stride(-1), out)) return false;
  if (!batch_stride(t, &out->batch_stride)) return false;
  out->data = t.data_ptr();
  return true;
}

// The kernel operand for `t`, replacing `t` by a dense copy when its layout
// is not one a GEMM can read.
kernels::GemmMatrix gemm_operand(Tensor& t) {
  kernels::GemmMatrix matrix;
  if (describe(t, &matrix)) return matrix;
  // An empty operand (k = 0) is never read, but is_contiguous() holds for an
  // empty tensor of any strides, so contiguous() would keep a layout the GEMM
  // cannot describe (say, an empty batch-broadcast A^T in matmul's backward).
  t = t.numel() == 0 ? empty(t.shape(), {.dtype = t.dtype(), .device = t.device()}) : t.contiguous();
  KILN_ASSERT(describe(t, &matrix), "a contiguous tensor of shape ", shape_str(t.shape()), " is not a GEMM operand");
  return matrix;
}

// a (B..., m, k) @ b (B..., k, n) [+ bias (n)] with equal batch shapes (batch
// strides may be 0): a new contiguous (B..., m, n). Records no autograd.
Tensor gemm(Tensor a, Tensor b, Tensor bias) {
  NoGradGuard no_grad;
  KILN_ASSERT(a.dim() >= 2 && a.dim() == b.dim() && a.size(-1) == b.size(-2), "gemm: shapes ",
              shape_str(a.shape()), " and ", shape_str(b.shape()));
  // The kernel reads every operand as a's dtype: a mismatch (say, a backward
  // formula handed a float32 gradient for a bfloat16 product) would be garbage.
  KILN_ASSERT(a.dtype() == b.dtype() && (!bias.defined() || bias.dtype() == a.dtype()), "gemm: dtypes ",
              dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
              bias.defined() ? " with a bias of " + std::string(dtype_name(bias.dtype())) : std::string());
  Shape out_shape(a.shape().begin(), a.shape().end() - 1);
  out_shape.push_back(b.size(-1));
  Tensor out = empty(out_shape, {.dtype = a.dtype(), .device = a.device()});
  kernels::GemmProblem problem;
  problem.dtype = a.dtype();
  problem.m = a.size(-2);
  problem.k = a.size(-1);
  problem.n = b.size(-1);
  problem.batch = shape_numel(Shape(out_shape.begin(), out_shape.end() - 2));
  if (out.numel() == 0) return out;
  problem.a = gemm_operand(a);
  problem.b = gemm_operand(b);
  problem.c = kernels::GemmMatrix{out.data_ptr(), problem.n, problem.m * problem.n, false};
  if (bias.defined()) {
    if (bias.stride(0) != 1) bias = bias.contiguous();
    problem.bias = bias.data_ptr();
  }
  if (out.is_cpu()) {
    kernels::gemm_cpu(problem);
  } else {
    const int device = out.device().index;
    const cuda::DeviceScope scope(device, "matmul");
    const cuda::Stream stream = scope.stream;
    const size_t workspace_bytes = kernels::gemm_cuda_workspace_bytes(device);
    // Stream-ordered: the caching allocator hands the block to the next GEMM on
    // this stream only after this one, and never to another stream meanwhile.
    std::shared_ptr<void> workspace = allocate_cuda(workspace_bytes, device, stream);
    kernels::gemm_cuda(problem, tf32_allowed.load(), workspace.get(), workspace_bytes, device, stream);
  }
  return out;
}

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  check_defined(a, op, "input");
  check_defined(b, op, "other");
  check_same_device(a, b, op);
  check_same_dtype(a, b, op);
  KILN_CHECK(is_floating(a.dtype()), op, ": expected a floating dtype (float32, float64, float16, bfloat16), got ",
             dtype_name(a.dtype()), " for shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
             "; integer products are not supported");
}

void check_inner(const Tensor& a, const Tensor& b, int64_t a_inner, int64_t b_inner, const char* op) {
  KILN_CHECK(a_inner == b_inner, op, ": the inner dimensions do not match: shapes ", shape_str(a.shape()), " and ",
             shape_str(b.shape()), " (", a_inner, " != ", b_inner, ")");
}

// The differentiable product of a (B..., m, k) and b (B..., k, n) with equal
// batch shapes: one GEMM forward, at most one per input backward.
Tensor product(const Tensor& a, const Tensor& b, const char* op) {
  Tensor out = gemm(a, b, Tensor());
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    // Save only what the backward reads: B for dA, A for dB.
    autograd::record(op, {a, b}, {out},
                     [need_a, need_b, saved_a = need_b ? autograd::SavedTensor(a, op) : autograd::SavedTensor(),
                      saved_b = need_a ? autograd::SavedTensor(b, op) : autograd::SavedTensor()](
                         const autograd::TensorList& grads) -> autograd::TensorList {
                       Tensor da, db;
                       if (need_a) da = gemm(grads[0], saved_b.unpack().transpose(-1, -2), Tensor());  // dC @ B^T
                       if (need_b) db = gemm(saved_a.unpack().transpose(-1, -2), grads[0], Tensor());  // A^T @ dC
                       return {da, db};
                     });
  }
  return out;
}

// True when dims [0, dim() - 1) of t merge into one (a reshape to (-1, last) is a view).
bool leading_dims_merge(const Tensor& t) {
  int64_t expected = -1;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    const int64_t size = t.shape()[d];
    if (size == 1) continue;
    if (expected >= 0 && t.strides()[d] != expected) return false;
    expected = t.strides()[d] * size;
  }
  return true;
}

}  // namespace

void set_allow_tf32(bool allow) { tf32_allowed.store(allow); }
bool allow_tf32() { return tf32_allowed.load(); }

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&a, &b})) {
    return matmul(to(a), to(b));
  }
  check_operands(a, b, "matmul");
  const int64_t da = a.dim(), db = b.dim();
  KILN_CHECK(da >= 1 && db >= 1, "matmul: both arguments need at least 1 dim, got shapes ", shape_str(a.shape()),
             " and ", shape_str(b.shape()));
  check_inner(a, b, a.size(-1), db == 1 ? b.size(0) : b.size(-2), "matmul");
  if (da == 1 && db == 1) return product(a.unsqueeze(0), b.unsqueeze(1), "matmul").reshape({});  // (1, 1) -> 0-d
  if (da <= 2 && db <= 2) {
    Tensor out = product(da == 1 ? a.unsqueeze(0) : a, db == 1 ? b.unsqueeze(1) : b, "matmul");
    return da == 1 ? out.squeeze(0) : db == 1 ? out.squeeze(1) : out;
  }
  if (da >= 3 && db <= 2 && leading_dims_merge(a)) {
    // (B..., m, k) @ (k, n): one (B*m, k) @ (k, n) GEMM; dB needs no batch sum.
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    Tensor out = product(a.reshape({shape_numel(out_shape), a.size(-1)}), db == 1 ? b.unsqueeze(1) : b, "matmul");
    if (db == 2) out_shape.push_back(b.size(1));
    return out.reshape(out_shape);
  }
  // Batched with broadcasting: expand both to the common batch shape (stride-0
  // views: no copy; their backward sums the gradient back).
  Tensor a2 = da == 1 ? a.unsqueeze(0) : a, b2 = db == 1 ? b.unsqueeze(1) : b;
  const Shape batch = broadcast_shapes(Shape(a2.shape().begin(), a2.shape().end() - 2),
                                       Shape(b2.shape().begin(), b2.shape().end() - 2), "matmul");
  Shape a_shape = batch, b_shape = batch;
  a_shape.insert(a_shape.end(), {a2.size(-2), a2.size(-1)});
  b_shape.insert(b_shape.end(), {b2.size(-2), b2.size(-1)});
  if (a2.shape() != a_shape) a2 = a2.expand(a_shape);
  if (b2.shape() != b_shape) b2 = b2.expand(b_shape);
  Tensor out = product(a2, b2, "matmul");
  if (da == 1) return out.squeeze(-2);
  if (db == 1) return out.squeeze(-1);
  return out;
}

Tensor mm(const Tensor& a, const Tensor& b) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&a, &b})) {
    return mm(to(a), to(b));
  }
  check_operands(a, b, "mm");
  KILN_CHECK(a.dim() == 2 && b.dim() == 2, "mm: expected two 2-D tensors, got shapes ", shape_str(a.shape()),
             " and ", shape_str(b.shape()));
  check_inner(a, b, a.size(1), b.size(0), "mm");
  return product(a, b, "mm");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&a, &b})) {
    return bmm(to(a), to(b));
  }
  check_operands(a, b, "bmm");
  KILN_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected two 3-D tensors, got shapes ", shape_str(a.shape()),
             " and ", shape_str(b.shape()));
  KILN_CHECK(a.size(0) == b.size(0), "bmm: the batch sizes differ: shapes ", shape_str(a.shape()), " and ",
             shape_str(b.shape()), " (bmm does not broadcast; use matmul)");
  check_inner(a, b, a.size(2), b.size(1), "bmm");
  return product(a, b, "bmm");
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::lower_precision, {&x, &weight, &bias})) {
    return linear(to(x), to(weight), to(bias));
  }
  check_operands(x, weight, "linear");
  KILN_CHECK(weight.dim() == 2, "linear: expected a 2-D weight (out_features, in_features), got shape ",
             shape_str(weight.shape()));
  KILN_CHECK(x.dim() >= 1, "linear: expected an input with at least 1 dim, got shape ", shape_str(x.shape()));
  const int64_t in_features = weight.size(1), out_features = weight.size(0);
  KILN_CHECK(x.size(-1) == in_features, "linear: input shape ", shape_str(x.shape()), " does not match weight shape ",
             shape_str(weight.shape()), " (last dim ", x.size(-1), " != in_features ", in_features, ")");
  if (bias.defined()) {
    check_same_device(x, bias, "linear");
    check_same_dtype(x, bias, "linear");
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == out_features, "linear: expected a bias of shape [",
               out_features, "] for weight shape ", shape_str(weight.shape()), ", got ", shape_str(bias.shape()));
  }
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(out_shape);
  out_shape.push_back(out_features);
  Tensor x2, out;
  {
    NoGradGuard no_grad;
    x2 = x.reshape({rows, in_features});  // a view unless x's leading dims do not merge
    out = gemm(x2, weight.t(), bias).view(out_shape);
  }
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    const Shape x_shape = x.shape();
    autograd::record(
        "linear", {x, weight, bias}, {out},
        [=, saved_x = need_w ? autograd::SavedTensor(x2, "linear") : autograd::SavedTensor(),
         saved_w = need_x ? autograd::SavedTensor(weight, "linear") : autograd::SavedTensor()](
            const autograd::TensorList& grads) -> autograd::TensorList {
          Tensor dout = grads[0].reshape({rows, out_features});  // (rows, out)
          Tensor dx, dweight, dbias;
          if (need_x) dx = gemm(dout, saved_w.unpack(), Tensor()).view(x_shape);         // (rows, in)
          if (need_w) dweight = gemm(dout.t(), saved_x.unpack(), Tensor());              // (out, in)
          if (need_b) {
            // The column sums of dout as a (1, rows) @ (rows, out) GEMM: a
            // fixed-order, vectorized reduction on both backends.
            Tensor ones_row = ones({1, rows}, {.dtype = dout.dtype(), .device = dout.device()});
            dbias = gemm(ones_row, dout, Tensor()).view({out_features});  // (out)
          }
          return {dx, dweight, dbias};
        });
  }
  return out;
}

}  // namespace kiln
