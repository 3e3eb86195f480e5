// One block of a dense elementwise op computed with Eigen's float32 packet
// math, whatever the storage type: float operands are mapped in place; Half
// and BFloat16 operands are widened into this thread's float buffers and the
// result rounded back once when the block ends. Shared by the dense paths of
// kernels/cpu/elementwise.cpp and elementwise_binary.cpp.
#pragma once

#include <Eigen/Core>

#include <array>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/dtype.h"

namespace kiln::kernels::cpu {

// Elements per block: a few float arrays of it stay in L2.
constexpr int64_t kDenseBlock = int64_t{1} << 14;

template <typename T, int N>
class DenseBlock {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>);

 public:
  DenseBlock(T* out, const std::array<const T*, N>& in, int64_t length) : out_(out), length_(length) {
    const auto size = static_cast<Eigen::Index>(length);
    if constexpr (std::is_same_v<T, float>) {
      for (int i = 0; i < N; ++i) inputs_[i].emplace(in[i], size);
      output_.emplace(out, size);
    } else {
      thread_local std::array<std::vector<float>, N + 1> buffers;
      for (auto& buffer : buffers) buffer.resize(static_cast<size_t>(kDenseBlock));
      for (int i = 0; i < N; ++i) {
        float* wide = buffers[i].data();
        for (int64_t j = 0; j < length; ++j) wide[j] = static_cast<float>(in[i][j]);
        inputs_[i].emplace(wide, size);
      }
      output_.emplace(buffers[N].data(), size);
    }
  }
  ~DenseBlock() {
    if constexpr (!std::is_same_v<T, float>) {
      const float* wide = output_->data();
      for (int64_t j = 0; j < length_; ++j) out_[j] = T(wide[j]);
    }
  }
  DenseBlock(const DenseBlock&) = delete;
  DenseBlock& operator=(const DenseBlock&) = delete;

  const Eigen::Map<const Eigen::ArrayXf>& input(int i) const { return *inputs_[i]; }
  Eigen::Map<Eigen::ArrayXf>& output() { return *output_; }

 private:
  T* out_;
  int64_t length_;
  std::array<std::optional<Eigen::Map<const Eigen::ArrayXf>>, N> inputs_;
  std::optional<Eigen::Map<Eigen::ArrayXf>> output_;
};

// f.template operator()<T>() for T = float, Half or BFloat16 as `dtype` says.
template <typename F>
void dispatch_dense_float(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f16: f.template operator()<Half>(); break;
    case DType::bf16: f.template operator()<BFloat16>(); break;
    default: f.template operator()<float>(); break;
  }
}

}  // namespace kiln::kernels::cpu
