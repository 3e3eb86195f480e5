// What the CPU convolution kernels (conv.cpp, conv_winograd.cpp) share: row-major
// Eigen maps over raw buffers, and per-thread scratch buffers that only grow,
// so a steady training loop allocates nothing in them.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <vector>

namespace kiln::kernels {

template <typename T>
using MatrixRM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using MapRM = Eigen::Map<MatrixRM<T>>;
template <typename T>
using ConstMapRM = Eigen::Map<const MatrixRM<T>>;

// A per-thread buffer of at least `count` T for `slot`. Slot is a file's own
// enum whose last enumerator is kSlots: each enum type gets its own buffers,
// so two kernels (one calling the other) never hand out the same memory.
template <typename T, typename Slot>
T* thread_buffer(size_t count, Slot slot) {
  thread_local std::vector<T> buffers[static_cast<size_t>(Slot::kSlots)];
  std::vector<T>& buffer = buffers[static_cast<size_t>(slot)];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

}  // namespace kiln::kernels
