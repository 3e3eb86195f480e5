// CUDA strided copy with dtype conversion, and fill. A dense same-dtype copy is
// one cudaMemcpyAsync; a same-dtype strided copy moves raw 1/2/4/8-byte words;
// conversions go through the elementwise launcher (vectorized when dense).
#include <cmath>

#include "kernels/copy.h"
#include "kernels/cuda/elementwise_launch.cuh"

namespace kiln::kernels {

namespace {

struct Identity {
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    return x;
  }
};

template <typename T>
struct Constant {
  T value;
  __device__ __forceinline__ T operator()() const { return value; }
};

template <typename Word>
void copy_words(const IterShape& shape, const Operand& dst, const Operand& src, cuda::Stream stream) {
  const Operand operands[2] = {dst, src};
  cuda_detail::launch<Word, Word>(shape, operands, Identity{}, stream, "copy");
}

template <typename To, typename From>
inline To host_convert(From value) {
  if constexpr (std::is_same_v<To, bool>) {
    return value != 0;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace

void copy_cuda(const IterShape& input_shape, const Operand& input_dst, const Operand& input_src, cuda::Stream stream) {
  IterShape shape = input_shape;
  Operand operands[2] = {input_dst, input_src};
  coalesce(shape, operands, 2);
  const int64_t n = shape.numel();
  if (n == 0) return;
  const DType to = operands[0].dtype, from = operands[1].dtype;
  if (to == from) {
    if (all_contiguous(shape, operands, 2)) {
      cuda::memcpy_async(operands[0].data, operands[1].data, static_cast<size_t>(n) * dtype_size(to),
                         cuda::CopyKind::device_to_device, stream);
      return;
    }
    switch (dtype_size(to)) {
      case 1: return copy_words<uint8_t>(shape, operands[0], operands[1], stream);
      case 2: return copy_words<uint16_t>(shape, operands[0], operands[1], stream);
      case 4: return copy_words<uint32_t>(shape, operands[0], operands[1], stream);
      case 8: return copy_words<uint64_t>(shape, operands[0], operands[1], stream);
      default: KILN_ASSERT(false, "copy: element size ", dtype_size(to));
    }
  }
  dispatch_all(to, "copy", [&]<typename To>() {
    dispatch_all(from, "copy", [&]<typename From>() {
      cuda_detail::launch<To, From>(shape, operands, Identity{}, stream, "copy");
    });
  });
}

void fill_cuda(void* data, DType dtype, int64_t count, double value, cuda::Stream stream) {
  if (count == 0) return;
  if (value == 0.0 && !std::signbit(value)) {
    // All-zero bits are zero in every dtype.
    cuda::memset_async(data, 0, static_cast<size_t>(count) * dtype_size(dtype), stream);
    return;
  }
  IterShape shape;
  shape.ndim = 1;
  shape.sizes[0] = count;
  Operand out;
  out.data = data;
  out.dtype = dtype;
  out.strides[0] = 1;
  dispatch_all(dtype, "fill", [&]<typename T>() {
    cuda_detail::launch<T>(shape, &out, Constant<T>{host_convert<T>(value)}, stream, "fill");
  });
}

}  // namespace kiln::kernels
