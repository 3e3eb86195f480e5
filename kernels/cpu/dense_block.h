// One block of a dense elementwise op computed with Eigen's float32 packet
// math, whatever the storage type: float operands are mapped in place (an
// output that aliases an input is computed in a buffer and copied); Half
// and BFloat16 operands are widened into this thread's float buffers and the
// result rounded back once when the block ends. Shared by the dense paths of
// kernels/cpu/elementwise.cpp and elementwise_binary.cpp.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "kernels/cpu/float_convert.h"
#include "kernels/dtype.h"

namespace kiln::kernels::cpu {

// Elements per block: its float arrays stay in L1. Small blocks keep the
// memory busy while a block computes (a 16-bit block is read and widened,
// computed, then written, one phase after the other). At 16 x 1024 x 768,
// old (16K) and new (1K) binaries alternated twice, 2-core VM: GELU forward
// bf16 3.6-3.8 -> 3.0 ms, float32 2.0 -> 2.0-2.5 (noise); forward+backward
// bf16 11.9-12.1 -> 9.7 ms, float32 9.4-12.2 -> 7.6 ms.
constexpr int64_t kDenseBlock = int64_t{1} << 10;
// Scratch blocks start where tensors do (the CPU allocator's 64 bytes): Eigen
// computes a block's unaligned head and tail with scalar code, whose exp or
// erf can differ from the packet's in the last bit, so a block computed apart
// (in place, or 16-bit widened) gives the bits a direct one gives.
constexpr size_t kScratchAlignment = 64;

template <typename T, int N>
class DenseBlock {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>);

 public:
  DenseBlock(T* out, const std::array<const T*, N>& in, int64_t length) : out_(out), length_(length) {
    const auto size = static_cast<Eigen::Index>(length);
    if constexpr (std::is_same_v<T, float>) {
      for (int i = 0; i < N; ++i) inputs_[i].emplace(in[i], size);
      bool in_place = false;
      for (int i = 0; i < N; ++i) in_place = in_place || in[i] == out;
      if (in_place) {
        // The output is computed apart and copied at the end: ops that use
        // the output as a scratch first (assign_flushed_exp) must still read
        // their inputs unchanged.
        alignas(kScratchAlignment) thread_local float apart[kDenseBlock];
        output_.emplace(apart, size);
        apart_ = true;
      } else {
        output_.emplace(out, size);
      }
    } else {
      alignas(kScratchAlignment) thread_local float buffers[N + 1][kDenseBlock];
      for (int i = 0; i < N; ++i) {
        float* wide = buffers[i];
        widen_to_float(in[i], wide, length);
        inputs_[i].emplace(wide, size);
      }
      output_.emplace(buffers[N], size);
    }
  }
  ~DenseBlock() {
    if constexpr (!std::is_same_v<T, float>) {
      narrow_from_float(output_->data(), out_, length_);
    } else if (apart_) {
      std::copy(output_->data(), output_->data() + length_, out_);
    }
  }
  DenseBlock(const DenseBlock&) = delete;
  DenseBlock& operator=(const DenseBlock&) = delete;

  const Eigen::Map<const Eigen::ArrayXf>& input(int i) const { return *inputs_[i]; }
  Eigen::Map<Eigen::ArrayXf>& output() { return *output_; }

 private:
  T* out_;
  int64_t length_;
  bool apart_ = false;  // float output computed in a buffer (it aliases an input)
  std::array<std::optional<Eigen::Map<const Eigen::ArrayXf>>, N> inputs_;
  std::optional<Eigen::Map<Eigen::ArrayXf>> output_;
};

// o = exp(a), flushed to 0 where a < -88. Eigen's packet exp clamps its
// argument at -88.38 and so returns 2.9e-39 where the true result is
// subnormal or 0 (exp(-inf) included): the flush keeps exp(-inf) == 0 and
// sigmoid/silu equal to libm's at the tails (absolute error < 6e-39). Two
// passes over o: a select whose operand is the exp expression itself is not
// vectorized by Eigen 3.4 and ran 4x slower (GELU's backward at 12% of copy).
template <typename Arg>
void assign_flushed_exp(Eigen::Map<Eigen::ArrayXf>& o, const Arg& a) {
  o = a.exp();
  o = (a < -88.0f).select(0.0f, o);
}

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
