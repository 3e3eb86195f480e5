// Tensor: storage + shape + strides + offset + dtype + device, with autograd
// data that stays null when no gradient is needed. Copying a Tensor copies a
// handle (shared ownership), like torch.Tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/storage.h"
#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);

class Tensor;

// Memory layouts of a dense tensor (torch.memory_format): row-major, or NHWC
// for 4-D (N, C, H, W) tensors. Convolutions on CUDA run cuDNN's NHWC kernels
// on channels-last tensors, and elementwise ops, batch norm and pooling keep
// the layout of their input.
enum class MemoryFormat { contiguous, channels_last };
namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

struct TensorImpl {
  Storage storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  std::unique_ptr<autograd::AutogradMeta> autograd;  // null when no grad needed
  std::string name;  // optional, used in error messages (parameters get theirs)

  TensorImpl();
  ~TensorImpl();
};

struct IntegerTensorOptions;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  bool pinned = false;  // page-locked host memory (cpu only)

  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_requires_grad(bool r = true) const { auto o = *this; o.requires_grad = r; return o; }
  // Given to arange/randint/randperm, the options keep their dtype.
  operator IntegerTensorOptions() const;
};

// The options of the factories whose dtype defaults to int64, as torch's do
// (arange, randint, randperm): the fields of TensorOptions with dtype int64,
// so that randint(0, 10, {3}, {.device = Device::cuda(0)}) gives int64 as
// torch.randint(0, 10, (3,), device="cuda") does (a TensorOptions initializer
// there would leave float32). A TensorOptions passed instead keeps its dtype.
struct IntegerTensorOptions {
  DType dtype = DType::i64;
  Device device = Device::cpu();
  bool requires_grad = false;
  bool pinned = false;

  TensorOptions tensor_options() const { return {dtype, device, requires_grad, pinned}; }
};

inline TensorOptions::operator IntegerTensorOptions() const { return {dtype, device, requires_grad, pinned}; }

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& other) const { return impl_ == other.impl_; }

  // --- metadata
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t size(int64_t dim) const;    // negative dims count from the end
  int64_t stride(int64_t dim) const;
  int64_t dim() const;
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_pinned() const;
  bool is_contiguous() const;
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  const Storage& storage() const;
  // Pointer to the first element (storage data + offset).
  void* data_ptr() const;
  // Typed pointer; throws if T is not the tensor's dtype.
  template <typename T> T* data() const;
  // The single element of a one-element tensor, converted to T (synchronizes a CUDA tensor).
  template <typename T> T item() const;
  // Copies every element to a host vector of T (in logical, row-major order).
  template <typename T> std::vector<T> to_vector() const;

  // --- autograd
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);
  bool is_leaf() const;
  // The accumulated gradient; undefined until first written.
  Tensor grad() const;
  // kiln::Error unless `grad` is undefined or has this tensor's shape, dtype and device.
  void set_grad(const Tensor& grad) const;
  void zero_grad_(bool set_to_none = true) const;
  std::shared_ptr<autograd::Node> grad_fn() const;
  // Runs backward from this tensor. `gradient` may be omitted for one element;
  // it must have this tensor's shape and device (another dtype is cast to this
  // tensor's, as torch does).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // A view that shares storage but is cut from the graph.
  Tensor detach() const;
  // A hook on the gradient flowing into this tensor; it may return a
  // replacement of the same shape, dtype and device (kiln::Error otherwise), or
  // an undefined tensor to keep the gradient as it is.
  void register_hook(std::function<Tensor(const Tensor&)> hook) const;
  // A hook that runs after a leaf's .grad has been accumulated (DDP uses it).
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const;
  // Keep .grad for a non-leaf tensor.
  void retain_grad() const;
  uint64_t version() const;
  void bump_version() const;
  const std::string& name() const;
  Tensor& set_name(std::string name);

  // --- views (share storage)
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // 2-D transpose
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor expand(const Shape& shape) const;
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  // torch's x.contiguous(memory_format=...): itself when it already has the
  // layout, else a copy with it (channels_last needs a 4-D tensor).
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;

  // --- conversion
  Tensor to(Device device, bool non_blocking = false) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  Tensor cpu() const { return to(Device::cpu()); }
  Tensor cuda(int index = 0) const { return to(Device::cuda(index)); }
  Tensor pin_memory() const;
  // Tells the caching allocator that `stream`, not only the stream this
  // tensor's memory was allocated on, uses it (torch's Tensor.record_stream):
  // once freed, the memory is reused only after `stream` has finished the work
  // queued on it by then. A no-op for memory the allocator does not own.
  // Throws for a CPU tensor. Does not synchronize.
  void record_stream(cuda::Stream stream) const;

  // --- in-place (bump the version counter)
  Tensor& copy_(const Tensor& source, bool non_blocking = false);
  Tensor& fill_(double value);
  Tensor& zero_();
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& sub_(const Tensor& other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& clamp_(double min, double max);
  Tensor& relu_();

  std::string to_string() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// --- factories (TensorOptions default: float32 on cpu)
Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor empty_strided(const Shape& shape, const Shape& strides, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor empty_like(const Tensor& like);
Tensor zeros_like(const Tensor& like);
Tensor ones_like(const Tensor& like);
Tensor full_like(const Tensor& like, double value);
Tensor scalar_tensor(double value, const TensorOptions& options = {});
// [start, end) with step; the dtype defaults to int64 unless options say otherwise.
Tensor arange(double start, double end, double step = 1.0, const IntegerTensorOptions& options = {});
Tensor arange(double end, const IntegerTensorOptions& options = {});
Tensor linspace(double start, double end, int64_t steps, const TensorOptions& options = {});
// Random factories draw from the default generator of the options' device
// (seeded Philox: the same seed gives the same numbers on CPU and CUDA).
Tensor rand(const Shape& shape, const TensorOptions& options = {});
Tensor randn(const Shape& shape, const TensorOptions& options = {});
Tensor randint(int64_t low, int64_t high, const Shape& shape, const IntegerTensorOptions& options = {});
Tensor randperm(int64_t n, const IntegerTensorOptions& options = {});
// A tensor over caller memory, without copying (torch.as_tensor / from_blob).
// The caller keeps `data` alive as long as the tensor (or pass a deleter).
Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu(),
                 std::function<void(void*)> deleter = {});
// Copies host values into a new tensor of `shape`.
template <typename T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options = {.dtype = dtype_of<T>::value});

// Row-major contiguous strides for `shape`.
Shape contiguous_strides(const Shape& shape);
// Dense NHWC strides for a 4-D shape (N, C, H, W): torch.channels_last.
Shape channels_last_strides(const Shape& shape);
// Whether t is 4-D with exactly channels_last_strides(shape) (size-1 dims
// included) and not also exactly row-major. Where both layouts address the
// same memory (C == 1, or H == W == 1) the strides a tensor was made with
// decide: contiguous(MemoryFormat::channels_last) of a (N, 1, H, W) tensor is
// channels-last, the plain tensor is not.
bool is_channels_last(const Tensor& t);
int64_t shape_numel(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// --- template definitions
template <typename T>
T* Tensor::data() const {
  KILN_CHECK(defined(), "data<", dtype_name(dtype_of<T>::value), ">(): the tensor is undefined");
  KILN_CHECK(dtype() == dtype_of<T>::value, "data<", dtype_name(dtype_of<T>::value),
             ">(): the tensor has dtype ", dtype_name(dtype()));
  return static_cast<T*>(data_ptr());
}

}  // namespace kiln
