// Tensor metadata, views, conversion, copy and the non-random factories.
// Elementwise in-place methods (add_, mul_, ...) live in core/ops/elementwise.cpp,
// the random factories in core/ops/random.cpp.
#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/launch.h"
#include "core/extent.h"
#include "core/ops.h"
#include "core/ops/broadcast.h"
#include "kernels/copy.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

TensorImpl::TensorImpl() = default;
TensorImpl::~TensorImpl() = default;

std::string shape_str(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape channels_last_strides(const Shape& shape) {
  KILN_CHECK(shape.size() == 4, "channels_last: expected a 4-D shape (N, C, H, W), got ", shape_str(shape));
  const int64_t C = std::max<int64_t>(shape[1], 1), H = std::max<int64_t>(shape[2], 1),
                W = std::max<int64_t>(shape[3], 1);
  return {H * W * C, 1, W * C, C};
}

bool is_channels_last(const Tensor& t) {
  if (t.dim() != 4 || t.numel() == 0) return false;
  // Exact strides, size-1 dims included: where the two layouts address the
  // same memory (C == 1, or H == W == 1) the strides still tell which one
  // the tensor was made in, as torch's suggest_memory_format does. Without
  // building the two stride vectors: every elementwise op on a 4-D tensor asks.
  const Shape& size = t.shape();
  const Shape& stride = t.strides();
  const int64_t C = std::max<int64_t>(size[1], 1), H = std::max<int64_t>(size[2], 1), W = std::max<int64_t>(size[3], 1);
  const bool nhwc = stride[0] == H * W * C && stride[1] == 1 && stride[2] == W * C && stride[3] == C;
  const bool nchw = stride[0] == C * H * W && stride[1] == H * W && stride[2] == W && stride[3] == 1;
  return nhwc && !nchw;
}

std::optional<ContiguousExtent> contiguous_extent(const Shape& shape, int64_t element_size) {
  int64_t outer_stride = 1;  // zeros counted as 1, as in contiguous_strides
  bool empty = false;
  for (int64_t size : shape) {
    if (size < 0 || __builtin_mul_overflow(outer_stride, std::max<int64_t>(size, 1), &outer_stride)) return {};
    empty |= size == 0;
  }
  ContiguousExtent extent{.numel = empty ? 0 : outer_stride, .nbytes = 0};
  if (__builtin_mul_overflow(extent.numel, element_size, &extent.nbytes)) return {};
  return extent;
}

int64_t shape_numel(const Shape& shape) {
  const std::optional<ContiguousExtent> extent = contiguous_extent(shape, 1);
  KILN_CHECK(extent.has_value(), "shape ", shape_str(shape), " is invalid: ",
             std::ranges::any_of(shape, [](int64_t size) { return size < 0; })
                 ? "a size is negative"
                 : "the product of its sizes (zeros counted as 1) does not fit in 64 bits");
  return extent->numel;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t rank = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  KILN_CHECK(dim >= -rank && dim < rank, op, ": dim ", dim, " is out of range for a tensor with ", ndim,
             " dims (expected in [", -rank, ", ", rank - 1, "])");
  return dim < 0 ? dim + rank : dim;
}

namespace {
// wrap_dim for ops that index an existing dim: a 0-d tensor has none (wrap_dim
// accepts dim 0 and -1 of a 0-d tensor for the reductions).
int64_t wrap_existing_dim(int64_t dim, int64_t ndim, const char* op) {
  KILN_CHECK(ndim > 0, op, ": dim ", dim, " is out of range for a 0-d tensor (it has no dims)");
  return wrap_dim(dim, ndim, op);
}

const TensorImpl& checked(const Tensor& tensor, const char* what) {
  KILN_CHECK(tensor.defined(), what, ": the tensor is undefined");
  return *tensor.impl();
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

void check_not_requiring_grad_inplace(const Tensor& tensor, const char* op) {
  KILN_CHECK(!(grad_mode_enabled() && tensor.requires_grad()), op,
             ": in-place write to a tensor that requires grad",
             tensor.name().empty() ? std::string() : " ('" + tensor.name() + "')",
             "; use the out-of-place op, or NoGradGuard for updates outside autograd");
}

// Records the backward of a view op whose gradient is `backward(grad)`.
void record_view(const char* name, const Tensor& input, const Tensor& output,
                 std::function<Tensor(const Tensor&)> backward) {
  if (!autograd::any_requires_grad({&input})) return;
  autograd::record(name, {input}, {output},
                   [backward = std::move(backward)](const autograd::TensorList& grads) -> autograd::TensorList {
                     return {backward(grads[0])};
                   });
}
}  // namespace

// ---------------------------------------------------------------- metadata
const Shape& Tensor::shape() const { return checked(*this, "shape").shape; }
const Shape& Tensor::strides() const { return checked(*this, "strides").strides; }
int64_t Tensor::size(int64_t dim) const { return shape()[wrap_existing_dim(dim, this->dim(), "size")]; }
int64_t Tensor::stride(int64_t dim) const { return strides()[wrap_existing_dim(dim, this->dim(), "stride")]; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::offset() const { return checked(*this, "offset").offset; }
DType Tensor::dtype() const { return checked(*this, "dtype").dtype; }
Device Tensor::device() const { return checked(*this, "device").storage->device; }
bool Tensor::is_pinned() const { return checked(*this, "is_pinned").storage->pinned; }
const Storage& Tensor::storage() const { return checked(*this, "storage").storage; }

bool Tensor::is_contiguous() const {
  const auto& impl = checked(*this, "is_contiguous");
  if (shape_numel(impl.shape) == 0) return true;
  int64_t expected = 1;
  for (size_t i = impl.shape.size(); i-- > 0;) {
    if (impl.shape[i] == 1) continue;
    if (impl.strides[i] != expected) return false;
    expected *= impl.shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  const auto& impl = checked(*this, "data_ptr");
  return static_cast<char*>(impl.storage->data.get()) + impl.offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu(), dtype_of<T>::value).contiguous();
  const T* values = static_cast<const T*>(host.data_ptr());
  return std::vector<T>(values, values + host.numel());
}

template <typename T>
T Tensor::item() const {
  KILN_CHECK(numel() == 1, "item(): expected a tensor with one element, got shape ", shape_str(shape()));
  return to_vector<T>()[0];
}

#define KILN_INSTANTIATE_READ(T)                      \
  template std::vector<T> Tensor::to_vector<T>() const; \
  template T Tensor::item<T>() const;
KILN_INSTANTIATE_READ(float)
KILN_INSTANTIATE_READ(double)
KILN_INSTANTIATE_READ(Half)
KILN_INSTANTIATE_READ(BFloat16)
KILN_INSTANTIATE_READ(int32_t)
KILN_INSTANTIATE_READ(int64_t)
KILN_INSTANTIATE_READ(uint8_t)
KILN_INSTANTIATE_READ(bool)
#undef KILN_INSTANTIATE_READ

// ---------------------------------------------------------------- autograd accessors
bool Tensor::requires_grad() const {
  const auto* m = autograd::meta_if(*this);
  return m != nullptr && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  KILN_CHECK(is_leaf(), "requires_grad_: only leaf tensors can change requires_grad (this one was computed by '",
             grad_fn()->name(), "'); use detach()");
  KILN_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating tensors can require grad, got ",
             dtype_name(dtype()));
  autograd::meta(*this).requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto* m = autograd::meta_if(*this);
  return m == nullptr || m->grad_fn == nullptr;
}

Tensor Tensor::grad() const {
  const auto* m = autograd::meta_if(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    KILN_CHECK(grad.shape() == shape() && grad.device() == device() && grad.dtype() == dtype(),
               "set_grad: gradient of shape ", shape_str(grad.shape()), ", ", dtype_name(grad.dtype()), " on ",
               grad.device(), " for a tensor of shape ", shape_str(shape()), ", ", dtype_name(dtype()), " on ",
               device());
  }
  autograd::meta(*this).grad = grad;
}

void Tensor::zero_grad_(bool set_to_none) const {
  auto* m = autograd::meta_if(*this);
  if (m == nullptr || !m->grad.defined()) return;
  if (set_to_none) {
    m->grad = Tensor();
  } else {
    NoGradGuard no_grad;
    m->grad.zero_();
  }
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const auto* m = autograd::meta_if(*this);
  return m ? m->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  KILN_CHECK(requires_grad(), "backward: the tensor does not require grad and has no grad_fn");
  Tensor seed = gradient;
  if (!seed.defined()) {
    KILN_CHECK(numel() == 1, "backward: a gradient is needed for a tensor of shape ", shape_str(shape()),
               " (only one-element tensors get an implicit gradient of 1)");
    seed = ones(shape(), TensorOptions{.dtype = dtype(), .device = device()});
  }
  KILN_CHECK(seed.shape() == shape(), "backward: gradient shape ", shape_str(seed.shape()),
             " does not match the tensor's shape ", shape_str(shape()));
  autograd::run_backward({*this}, {seed}, retain_graph);
}

Tensor Tensor::detach() const {
  Tensor alias = make_view(*this, shape(), strides(), offset());
  alias.impl()->name = impl()->name;
  return alias;
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  KILN_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  auto& m = autograd::meta(*this);
  if (m.grad_fn) {
    m.grad_fn->pre_hooks[m.output_nr].push_back(std::move(hook));
  } else {
    m.hooks.push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  KILN_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook: expected a leaf that requires grad");
  autograd::meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  KILN_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  auto& m = autograd::meta(*this);
  if (!m.grad_fn || m.retains_grad) return;
  m.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  m.grad_fn->pre_hooks[m.output_nr].push_back([weak](const Tensor& grad) {
    if (auto impl = weak.lock()) {
      auto& meta = autograd::meta(Tensor(impl));
      meta.grad = meta.grad.defined() ? add(meta.grad, grad) : grad.clone();
    }
    return Tensor();
  });
}

uint64_t Tensor::version() const { return storage()->version.load(); }
void Tensor::bump_version() const { storage()->version.fetch_add(1); }
const std::string& Tensor::name() const { return checked(*this, "name").name; }
Tensor& Tensor::set_name(std::string name) {
  checked(*this, "set_name");
  impl_->name = std::move(name);
  return *this;
}

// ---------------------------------------------------------------- views

namespace {
// Strides for viewing (shape, strides) as new_shape without copying, or empty
// when impossible (the chunk-matching rule of torch's computeStride).
std::optional<Shape> view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  Shape new_strides(new_shape.size());
  if (shape_numel(shape) == 0) return contiguous_strides(new_shape);
  if (shape.empty()) return Shape(new_shape.size(), 1);  // a 0-d tensor views as any all-ones shape
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= shape[tensor_d];
    if (tensor_d == 0 || (shape[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer < 0, op, ": only one dimension can be -1, got ", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in ", shape_str(requested));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(requested), " is invalid for ", numel,
               " elements");
    shape[infer] = numel / known;
  }
  KILN_CHECK(shape_numel(shape) == numel, op, ": shape ", shape_str(requested), " is invalid for ", numel,
             " elements");
  return shape;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape new_shape = infer_shape(requested, numel(), "view");
  auto new_strides = view_strides(shape(), strides(), new_shape);
  KILN_CHECK(new_strides.has_value(), "view: shape ", shape_str(requested), " is not compatible with the strides ",
             shape_str(strides()), " of a tensor of shape ", shape_str(shape()), "; use reshape()");
  Tensor out = make_view(*this, new_shape, *new_strides, offset());
  Shape input_shape = shape();
  record_view("view", *this, out, [input_shape](const Tensor& g) { return g.reshape(input_shape); });
  return out;
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape new_shape = infer_shape(requested, numel(), "reshape");
  if (view_strides(shape(), strides(), new_shape).has_value()) return view(new_shape);
  return contiguous().view(new_shape);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  const int64_t n = dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == n, "permute: got ", dims.size(), " dims for a tensor with ", n);
  Shape new_shape(n), new_strides(n);
  std::vector<int64_t> inverse(n, -1);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    KILN_CHECK(inverse[d] < 0, "permute: dim ", d, " repeated in ", shape_str(dims));
    inverse[d] = i;
    new_shape[i] = shape()[d];
    new_strides[i] = strides()[d];
  }
  Tensor out = make_view(*this, new_shape, new_strides, offset());
  record_view("permute", *this, out, [inverse](const Tensor& g) { return g.permute(inverse); });
  return out;
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t n = dim();
  if (n == 0) {  // dims 0 and -1 only, as torch
    wrap_dim(dim0, n, "transpose");
    wrap_dim(dim1, n, "transpose");
    return view({});
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[wrap_dim(dim0, n, "transpose")], order[wrap_dim(dim1, n, "transpose")]);
  return permute(order);
}

Tensor Tensor::t() const {
  KILN_CHECK(dim() <= 2, "t(): expected a tensor with at most 2 dims, got shape ", shape_str(shape()));
  return dim() < 2 ? view(shape()) : transpose(0, 1);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  const int64_t d = wrap_existing_dim(dim, this->dim(), "slice");
  KILN_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t size = shape()[d];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape new_shape = shape(), new_strides = strides();
  new_shape[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for a huge step
  new_strides[d] *= step;
  Tensor out = make_view(*this, new_shape, new_strides, offset() + start * strides()[d]);
  Shape input_shape = shape();
  TensorOptions options{.dtype = this->dtype(), .device = device()};
  record_view("slice", *this, out, [=](const Tensor& g) {
    Tensor grad_input = zeros(input_shape, options);
    grad_input.slice(d, start, end, step).copy_(g);
    return grad_input;
  });
  return out;
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = wrap_existing_dim(dim, this->dim(), "narrow");
  const int64_t size = shape()[d];
  if (start < 0) start += size;
  KILN_CHECK(start >= 0 && start <= size && length >= 0 && length <= size - start, "narrow: start ", start,
             " and length ", length, " are out of range for dim ", d, " of size ", size);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const int64_t d = wrap_existing_dim(dim, this->dim(), "select");
  const int64_t size = shape()[d];
  KILN_CHECK(index >= -size && index < size, "select: index ", index, " is out of range for dim ", d, " of size ",
             size);
  if (index < 0) index += size;
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& requested) const {
  const int64_t n = static_cast<int64_t>(requested.size());
  KILN_CHECK(n >= dim(), "expand: cannot expand shape ", shape_str(shape()), " to ", shape_str(requested));
  Shape new_shape(n), new_strides(n);
  const int64_t lead = n - dim();
  for (int64_t i = 0; i < n; ++i) {
    if (i < lead) {
      KILN_CHECK(requested[i] >= 0, "expand: invalid size ", requested[i], " in ", shape_str(requested));
      new_shape[i] = requested[i];
      new_strides[i] = 0;
      continue;
    }
    const int64_t own = shape()[i - lead];
    const int64_t want = requested[i] == -1 ? own : requested[i];
    KILN_CHECK(want >= 0, "expand: invalid size ", requested[i], " in ", shape_str(requested));
    KILN_CHECK(own == want || own == 1, "expand: cannot expand shape ", shape_str(shape()), " to ",
               shape_str(requested), " (dim ", i, ": ", own, " to ", want, ")");
    new_shape[i] = want;
    new_strides[i] = own == want ? strides()[i - lead] : 0;
  }
  Tensor out = make_view(*this, new_shape, new_strides, offset());
  Shape input_shape = shape();
  record_view("expand", *this, out, [input_shape](const Tensor& g) { return sum_to(g, input_shape); });
  return out;
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int64_t d = wrap_dim(dim, this->dim(), "squeeze");  // dim 0 or -1 of a 0-d tensor
  if (this->dim() == 0) return view({});
  if (shape()[d] != 1) return view(shape());
  Shape new_shape = shape();
  new_shape.erase(new_shape.begin() + d);
  return view(new_shape);
}

Tensor Tensor::squeeze() const {
  Shape new_shape;
  for (int64_t size : shape()) {
    if (size != 1) new_shape.push_back(size);
  }
  return view(new_shape);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int64_t d = wrap_dim(dim, this->dim() + 1, "unsqueeze");
  Shape new_shape = shape();
  new_shape.insert(new_shape.begin() + d, 1);
  return view(new_shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t start = wrap_dim(start_dim, dim(), "flatten"), end = wrap_dim(end_dim, dim(), "flatten");
  KILN_CHECK(start <= end, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape new_shape(shape().begin(), shape().begin() + start);
  int64_t merged = 1;
  for (int64_t i = start; i <= end; ++i) merged *= shape()[i];
  new_shape.push_back(merged);
  new_shape.insert(new_shape.end(), shape().begin() + end + 1, shape().end());
  return reshape(new_shape);
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::contiguous) return contiguous();
  KILN_CHECK(dim() == 4, "contiguous(channels_last): expected a 4-D tensor (N, C, H, W), got shape ",
             shape_str(shape()));
  const Shape expected = channels_last_strides(shape());
  if (strides() == expected) return *this;
  bool dense = true;
  for (int d = 0; d < 4; ++d) dense = dense && (shape()[d] == 1 || strides()[d] == expected[d]);
  if (dense) {
    // The same memory in NHWC order already (a size-1 dim's stride differs):
    // a view with the channels-last strides, no copy.
    Tensor out = make_view(*this, shape(), expected, offset());
    record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
    return out;
  }
  Tensor out = empty_strided(shape(), expected, TensorOptions{.dtype = dtype(), .device = device()});
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  record_view("contiguous", *this, out, [](const Tensor& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), TensorOptions{.dtype = dtype(), .device = device()});
  {
    NoGradGuard no_grad;
    out.copy_(*this);
  }
  record_view("clone", *this, out, [](const Tensor& g) { return g; });
  return out;
}

// ---------------------------------------------------------------- conversion and copy

Tensor Tensor::to(Device target, DType target_dtype, bool non_blocking) const {
  if (target == device() && target_dtype == dtype()) return *this;
  if (target.is_cuda()) {
    KILN_CHECK(target.index < cuda::device_count(), "to(", target, "): no such CUDA device (",
               cuda::device_count(), " available",
               cuda::compiled_with_cuda() ? "" : "; kiln was built without CUDA", ")");
  }
  // A channels-last tensor stays channels-last (torch's preserve_format).
  const TensorOptions options{.dtype = target_dtype, .device = target};
  Tensor out = empty_in_layout_of(*this, shape(), options);
  {
    NoGradGuard no_grad;
    out.copy_(*this, non_blocking);
  }
  if (autograd::any_requires_grad({this}) && is_floating(target_dtype)) {
    Device source_device = device();
    DType source_dtype = dtype();
    autograd::record("to", {*this}, {out}, [=](const autograd::TensorList& grads) -> autograd::TensorList {
      return {grads[0].to(source_device, source_dtype)};
    });
  }
  return out;
}

Tensor Tensor::to(Device target, bool non_blocking) const { return to(target, dtype(), non_blocking); }
Tensor Tensor::to(DType target_dtype) const { return to(device(), target_dtype); }

Tensor Tensor::pin_memory() const {
  KILN_CHECK(is_cpu(), "pin_memory: expected a cpu tensor, got one on ", device());
  if (is_pinned()) return *this;
  Tensor out = empty(shape(), TensorOptions{.dtype = dtype(), .device = Device::cpu(), .pinned = true});
  out.copy_(*this);
  return out;
}

void Tensor::record_stream(cuda::Stream stream) const {
  KILN_CHECK(defined(), "record_stream: undefined tensor");
  KILN_CHECK(is_cuda(), "record_stream: expected a CUDA tensor, got one on ", device());
  (void)cuda_allocator(device().index).record_stream(storage()->data.get(), stream);
}

Tensor& Tensor::copy_(const Tensor& source, bool non_blocking) {
  KILN_CHECK(defined() && source.defined(), "copy_: undefined tensor");
  check_not_requiring_grad_inplace(*this, "copy_");
  const kernels::Operand source_operand = operand(source, shape(), "copy_");
  if (numel() == 0) return *this;
  bump_version();
  const Device dst_device = device(), src_device = source.device();
  kernels::IterShape iter = iter_shape(shape());
  kernels::Operand ops[2] = {operand(*this, shape(), "copy_"), source_operand};
  iterate_in_memory_order(iter, ops, 2);  // a layout copy walks its destination in order
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    kernels::copy_cpu(iter, ops[0], ops[1]);
    return *this;
  }
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device == src_device) {
    kernels::copy_cuda(iter, ops[0], ops[1], launch_on(dst_device, "copy_").stream);
    return *this;
  }
  // A pinned host source in another dtype (a bf16-true batch from float32
  // pinned buffers): its bytes travel as they are, without waiting, and the
  // cast runs on the device. Cast on the host, they would be staged in
  // pageable memory, whose copy has to wait for the device.
  if (dst_device.is_cuda() && src_device.is_cpu() && non_blocking && source.dtype() != dtype() &&
      source.is_pinned()) {
    return copy_(source.to(dst_device, /*non_blocking=*/true));
  }
  // Across devices: stage a dense copy in the destination dtype on the source
  // side, move the bytes, then scatter into the destination's layout if needed.
  // A dense channels-last destination takes the bytes of a source with its
  // strides as they are (both cover numel() elements from their data pointer).
  const bool channels_last = is_channels_last(*this);
  Tensor staged = source.expand(shape());
  const bool dense_match = staged.is_contiguous() || (channels_last && staged.strides() == strides());
  if (staged.dtype() != dtype() || !dense_match) {
    Tensor dense = empty_in_layout_of(*this, shape(), TensorOptions{.dtype = dtype(), .device = src_device});
    dense.copy_(staged);
    staged = dense;
  }
  const bool lands_in_place = is_contiguous() || (channels_last && staged.strides() == strides());
  Tensor landing = lands_in_place ? *this : empty(shape(), TensorOptions{.dtype = dtype(), .device = dst_device});
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    // Peer copy between devices, ordered after the source device's work. It
    // waits for its end too: the source stream knows nothing of the copy, so
    // its later work could overwrite the source, and the staging buffer goes
    // back to the source stream's pool when this returns.
    cuda::stream_synchronize(cuda::current_stream(src_device.index));
    cuda::DeviceGuard on_destination(dst_device.index, "copy_ between devices");
    const cuda::Stream stream = cuda::current_stream(dst_device.index);
    cuda::memcpy_async(landing.data_ptr(), staged.data_ptr(), nbytes(), cuda::CopyKind::device_to_device, stream);
    cuda::stream_synchronize(stream);
  } else if (dst_device.is_cuda()) {
    cuda::memcpy_async(landing.data_ptr(), staged.data_ptr(), nbytes(), cuda::CopyKind::host_to_device,
                       cuda::current_stream(dst_device.index));
    // Pageable host memory may be reused by the caller as soon as we return.
    if (!(non_blocking && staged.is_pinned())) cuda::stream_synchronize(cuda::current_stream(dst_device.index));
  } else {
    cuda::Stream stream = cuda::current_stream(src_device.index);
    cuda::memcpy_async(landing.data_ptr(), staged.data_ptr(), nbytes(), cuda::CopyKind::device_to_host, stream);
    if (!(non_blocking && landing.is_pinned())) cuda::stream_synchronize(stream);
  }
  if (!landing.same(*this)) copy_(landing);
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_not_requiring_grad_inplace(*this, "fill_");
  if (numel() == 0) return *this;
  if (!is_contiguous() && !is_channels_last(*this)) {  // a dense channels-last tensor fills as one range
    Tensor dense = full(shape(), value, TensorOptions{.dtype = dtype(), .device = device()});
    return copy_(dense);
  }
  bump_version();
  if (is_cpu()) {
    kernels::fill_cpu(data_ptr(), dtype(), numel(), value);
  } else {
    kernels::fill_cuda(data_ptr(), dtype(), numel(), value, launch_on(device(), "fill_").stream);
  }
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

// ---------------------------------------------------------------- printing

namespace {
void print_values(std::ostream& out, const std::vector<double>& values, const Shape& shape, size_t dim,
                  int64_t base, int64_t stride, bool floating, int indent, bool summarize) {
  if (shape.empty()) {
    if (floating) {
      out << std::fixed << std::setprecision(4) << values[0];
    } else {
      out << static_cast<int64_t>(values[0]);
    }
    return;
  }
  const int64_t size = shape[dim];
  const int64_t inner = stride / size;
  out << "[";
  for (int64_t i = 0; i < size; ++i) {
    if (summarize && size > 6 && i == 3) {
      out << (dim + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = size - 3;
    }
    if (dim + 1 == shape.size()) {
      double value = values[base + i];
      if (floating) {
        out << std::fixed << std::setprecision(4) << value;
      } else {
        out << static_cast<int64_t>(value);
      }
      if (i + 1 < size) out << ", ";
    } else {
      print_values(out, values, shape, dim + 1, base + i * inner, inner, floating, indent + 1, summarize);
      if (i + 1 < size) out << ",\n" << std::string(indent + 1, ' ');
    }
  }
  out << "]";
}
}  // namespace

std::string Tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream out;
  out << "tensor(";
  std::vector<double> values = to_vector<double>();
  print_values(out, values, shape(), 0, 0, std::max<int64_t>(numel(), 1), is_floating(dtype()), 7, numel() > 1000);
  out << ", shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype()) << ", device=" << device();
  if (requires_grad()) out << ", requires_grad=true";
  out << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) { return out << tensor.to_string(); }

// ---------------------------------------------------------------- factories

Tensor empty(const Shape& shape, const TensorOptions& options) {
  for (int64_t size : shape) KILN_CHECK(size >= 0, "empty: negative size in shape ", shape_str(shape));
  KILN_CHECK(!options.requires_grad || is_floating(options.dtype),
             "empty: only floating tensors can require grad, got ", dtype_name(options.dtype));
  const std::optional<ContiguousExtent> extent =
      contiguous_extent(shape, static_cast<int64_t>(dtype_size(options.dtype)));
  KILN_CHECK(extent.has_value(), "empty: shape ", shape_str(shape), " of ", dtype_name(options.dtype),
             " overflows 64 bits: its element count (zeros counted as 1) or byte count does not fit");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = make_storage(static_cast<size_t>(extent->nbytes), options.device, options.pinned);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = options.dtype;
  Tensor out(std::move(impl));
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor empty_strided(const Shape& shape, const Shape& strides, const TensorOptions& options) {
  KILN_CHECK(shape.size() == strides.size(), "empty_strided: ", shape.size(), " sizes but ", strides.size(),
             " strides");
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    KILN_CHECK(shape[i] >= 0 && strides[i] >= 0, "empty_strided: negative size or stride");
    if (shape[i] == 0) extent = 0;
  }
  bool overflow = false;
  if (extent != 0) {
    for (size_t i = 0; i < shape.size(); ++i) {
      int64_t reach = 0;
      overflow |= __builtin_mul_overflow(shape[i] - 1, strides[i], &reach);
      overflow |= __builtin_add_overflow(extent, reach, &extent);
    }
  }
  int64_t nbytes = 0;
  overflow = overflow || __builtin_mul_overflow(extent, static_cast<int64_t>(dtype_size(options.dtype)), &nbytes);
  KILN_CHECK(!overflow, "empty_strided: sizes ", shape_str(shape), " with strides ", shape_str(strides),
             " reach past 2^63 bytes");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = make_storage(static_cast<size_t>(nbytes), options.device, options.pinned);
  impl->shape = shape;
  impl->strides = strides;
  impl->dtype = options.dtype;
  Tensor out(std::move(impl));
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  TensorOptions plain = options;
  plain.requires_grad = false;
  Tensor out = empty(shape, plain);
  out.fill_(value);
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }
Tensor empty_like(const Tensor& like) { return empty(like.shape(), {.dtype = like.dtype(), .device = like.device()}); }
Tensor zeros_like(const Tensor& like) { return zeros(like.shape(), {.dtype = like.dtype(), .device = like.device()}); }
Tensor ones_like(const Tensor& like) { return ones(like.shape(), {.dtype = like.dtype(), .device = like.device()}); }
Tensor full_like(const Tensor& like, double value) {
  return full(like.shape(), value, {.dtype = like.dtype(), .device = like.device()});
}
Tensor scalar_tensor(double value, const TensorOptions& options) { return full({}, value, options); }

namespace {
// Builds a host float64 vector and converts it to the requested dtype and device.
Tensor from_host_doubles(const std::vector<double>& values, const TensorOptions& options) {
  Tensor host = empty({static_cast<int64_t>(values.size())}, {.dtype = DType::f64});
  std::copy(values.begin(), values.end(), host.data<double>());
  Tensor out = host.to(options.device, options.dtype);
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}
}  // namespace

Tensor arange(double start, double end, double step, const IntegerTensorOptions& integer_options) {
  const TensorOptions options = integer_options.tensor_options();
  KILN_CHECK(step != 0, "arange: step must be nonzero");
  KILN_CHECK((end - start) / step >= 0 || start == end, "arange: the sign of step ", step,
             " does not lead from ", start, " to ", end);
  const int64_t count = static_cast<int64_t>(std::ceil((end - start) / step));
  std::vector<double> values(std::max<int64_t>(count, 0));
  for (int64_t i = 0; i < count; ++i) values[i] = start + static_cast<double>(i) * step;
  return from_host_doubles(values, options);
}

Tensor arange(double end, const IntegerTensorOptions& options) { return arange(0, end, 1, options); }

Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options) {
  KILN_CHECK(steps >= 0, "linspace: steps must be non-negative, got ", steps);
  std::vector<double> values(steps);
  if (steps == 1) return from_host_doubles({start}, options);
  const double step = steps > 1 ? (end - start) / static_cast<double>(steps - 1) : 0.0;
  // Symmetric evaluation from both ends, as torch does, so the last value is exact.
  for (int64_t i = 0; i < steps; ++i) {
    values[i] = i < steps / 2 ? start + step * static_cast<double>(i)
                              : end - step * static_cast<double>(steps - 1 - i);
  }
  return from_host_doubles(values, options);
}

Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device, std::function<void(void*)> deleter) {
  KILN_CHECK(data != nullptr || shape_numel(shape) == 0, "from_blob: null data for shape ", shape_str(shape));
  if (device.is_cuda()) {
    // A kernel reading host memory as device memory is an illegal address: it
    // ends every later CUDA call of the process (the first H200 run lost a
    // test file's remaining GPU cases to one). Refused here instead.
    KILN_CHECK(cuda::is_available(), "from_blob: device ", device, " but no CUDA device is available (",
               cuda::availability().problem, ")");
    if (shape_numel(shape) > 0) {
      const int owner = cuda::pointer_device(data);
      KILN_CHECK(owner == device.index, "from_blob: the data for ", device, " is ",
                 owner < 0 ? std::string("host memory (or memory CUDA does not know)")
                           : "memory of cuda:" + std::to_string(owner),
                 "; pass the device it lives on, or copy host data with tensor(...).to(", device, ")");
    }
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage_from_blob(data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device,
                                    std::move(deleter));
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  KILN_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "tensor: ", values.size(),
             " values for shape ", shape_str(shape));
  Tensor host = empty(shape, {.dtype = dtype_of<T>::value});
  std::copy(values.begin(), values.end(), static_cast<T*>(host.data_ptr()));
  Tensor out = host.to(options.device, options.dtype);
  if (options.requires_grad) out.requires_grad_(true);
  return out;
}

template Tensor tensor<float>(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor tensor<double>(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Shape&, const TensorOptions&);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Shape&, const TensorOptions&);
template Tensor tensor<uint8_t>(const std::vector<uint8_t>&, const Shape&, const TensorOptions&);

}  // namespace kiln
