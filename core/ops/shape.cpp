// Joining and splitting: cat, stack, split, chunk (torch semantics).
//
// cat allocates its output and copies each input into its slice with
// Tensor::copy_ (so it works on every device and layout); its backward narrows
// the gradient. stack is cat of unsqueezed inputs. split and chunk return
// narrow() views recorded as one node, whose backward is one cat of the
// pieces' gradients (zeros for a piece that got none): a view per piece
// would give each piece's gradient a zero tensor of the whole input and the
// engine then sums them (GPT's qkv split: 3 zero fills, 3 copies and 2 adds
// of (B, T, 3 E) instead of one cat).
//
// cat keeps torch's legacy rule: a 1-D tensor of shape (0,) is skipped,
// whatever the rank of the others (it gets a gradient of shape (0,)). All
// inputs must have the same dtype and device (no promotion).
#include <algorithm>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace kiln {

namespace {

bool is_legacy_empty(const Tensor& tensor) { return tensor.dim() == 1 && tensor.shape()[0] == 0; }

Tensor cat_impl(const char* op, const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), op, ": expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) KILN_CHECK(tensors[i].defined(), op, ": tensor ", i, " is undefined");
  // The first tensor that is not a legacy (0,) tensor sets rank and sizes.
  size_t reference = 0;
  while (reference < tensors.size() && is_legacy_empty(tensors[reference])) ++reference;
  if (reference == tensors.size()) reference = 0;
  const Tensor& first = tensors[reference];
  KILN_CHECK(first.dim() > 0, op, ": tensor ", reference,
             " is zero-dimensional (shape []) and cannot be concatenated; unsqueeze it first");
  const int64_t d = wrap_dim(dim, first.dim(), op);

  std::vector<bool> skipped(tensors.size(), false);
  std::vector<int64_t> offsets(tensors.size(), 0);
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.dtype() == first.dtype(), op, ": tensor ", i, " has dtype ", dtype_name(t.dtype()), " but tensor ",
               reference, " has dtype ", dtype_name(first.dtype()), " (all tensors must have the same dtype)");
    KILN_CHECK(t.device() == first.device(), op, ": tensor ", i, " is on ", t.device(), " but tensor ", reference,
               " is on ", first.device(), " (all tensors must be on the same device)");
    if (i != reference && is_legacy_empty(t)) {
      skipped[i] = true;
      continue;
    }
    KILN_CHECK(t.dim() == first.dim(), op, ": tensor ", i, " has ", t.dim(), " dims (shape ", shape_str(t.shape()),
               ") but tensor ", reference, " has ", first.dim(), " (shape ", shape_str(first.shape()), ")");
    for (int64_t k = 0; k < t.dim(); ++k) {
      KILN_CHECK(k == d || t.shape()[k] == first.shape()[k], op, ": tensor ", i, " has shape ", shape_str(t.shape()),
                 " but tensor ", reference, " has shape ", shape_str(first.shape()),
                 "; sizes must match except in the cat dim ", d, " (they differ in dim ", k, ")");
    }
    offsets[i] = out_shape[d];
    out_shape[d] += t.shape()[d];
  }

  Tensor out = empty(out_shape, TensorOptions{.dtype = first.dtype(), .device = first.device()});
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!skipped[i] && tensors[i].numel() > 0) out.narrow(d, offsets[i], tensors[i].shape()[d]).copy_(tensors[i]);
    }
  }
  if (autograd::any_requires_grad(tensors)) {
    std::vector<bool> needs(tensors.size());
    std::vector<int64_t> sizes(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      needs[i] = tensors[i].requires_grad();
      sizes[i] = skipped[i] ? 0 : tensors[i].shape()[d];
    }
    autograd::record(op, tensors, {out},
                     [d, needs, skipped, offsets, sizes](const autograd::TensorList& grads) -> autograd::TensorList {
                       const Tensor& grad = grads[0];
                       const TensorOptions options{.dtype = grad.dtype(), .device = grad.device()};
                       autograd::TensorList result(needs.size());
                       for (size_t i = 0; i < needs.size(); ++i) {
                         if (!needs[i]) continue;
                         result[i] = skipped[i] ? zeros({0}, options) : grad.narrow(d, offsets[i], sizes[i]);
                       }
                       return result;
                     });
  }
  return out;
}

}  // namespace

namespace {
// Under autocast cat and stack take the widest floating dtype of their inputs
// (torch's promote list): a bfloat16 activation joins a float32 parameter.
std::vector<Tensor> promoted(const autocast::Cast& to, const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back(to(t));
  return out;
}
}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, tensors)) {
    return cat_impl("cat", promoted(to, tensors), dim);
  }
  return cat_impl("cat", tensors, dim);
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  if (const autocast::Cast to = autocast::plan(autocast::Policy::promote, tensors)) {
    return stack(promoted(to, tensors), dim);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    KILN_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: expected tensors of equal shape, but tensor ", i,
               " has shape ", shape_str(tensors[i].shape()), " and tensor 0 has shape ",
               shape_str(tensors[0].shape()));
  }
  const int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> unsqueezed;
  unsqueezed.reserve(tensors.size());
  for (const Tensor& t : tensors) unsqueezed.push_back(t.unsqueeze(d));
  return cat_impl("stack", unsqueezed, d);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  KILN_CHECK(x.defined(), "split: input is an undefined tensor");
  KILN_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t size : sizes) {
    KILN_CHECK(size >= 0, "split: sizes ", shape_str(sizes), " contain a negative size");
    total += size;
  }
  KILN_CHECK(total == x.shape()[d], "split: sizes ", shape_str(sizes), " sum to ", total, " but dim ", d,
             " of shape ", shape_str(x.shape()), " has size ", x.shape()[d]);
  std::vector<Tensor> pieces;
  pieces.reserve(sizes.size());
  {
    NoGradGuard views_only;  // recorded below, as one node
    int64_t start = 0;
    for (int64_t size : sizes) {
      pieces.push_back(x.narrow(d, start, size));
      start += size;
    }
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::record("split", {x}, pieces, [d](const autograd::TensorList& grads) -> autograd::TensorList {
      return {cat(grads, d)};  // the engine gives a piece without a gradient zeros
    });
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(x.defined(), "split: input is an undefined tensor");
  KILN_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.shape()[d];
  KILN_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, got ", split_size,
             " (0 is allowed only for a dim of size 0)");
  if (n == 0) return {x.narrow(d, 0, 0)};
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(x.defined(), "chunk: input is an undefined tensor");
  KILN_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got ", chunks);
  KILN_CHECK(x.dim() > 0, "chunk: cannot chunk a zero-dimensional tensor");
  const int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.shape()[d];
  // As torch: pieces of ceil(n / chunks), possibly fewer than `chunks`; a dim of size 0 gives `chunks` empty pieces.
  if (n == 0) return split(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace kiln
