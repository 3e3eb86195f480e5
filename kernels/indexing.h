// Gather and scatter-add along one dim: the kernels behind index_select,
// gather, scatter_add and embedding, forward and backward.
//
// Both iterate over the index's shape. For a coordinate c of that shape:
//   gather:       values[c] = data[c with c[dim] = index[c]]
//   scatter_add:  data[c with c[dim] = index[c]] += values[c]
// index_select and embedding pass an index whose strides are 0 on every dim
// but `dim` (a 1-D index broadcast over the other dims).
//
// Index values must lie in [0, data_dim_size). CPU kernels skip an element
// whose index is out of range and report it (the front end throws). CUDA
// kernels cannot throw without synchronizing: they skip the element (gather
// writes 0) and record the first bad value in a per-device error slot that
// index_error_cuda() reads. scatter_add_cpu is deterministic (each output
// element is summed by one thread, in index order); scatter_add_cuda uses
// atomics, scatter_add_sorted_cuda / index_add_sorted_cuda do not.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/strided.h"

namespace kiln::kernels {

struct IndexArgs {
  IterShape shape;        // the index's shape
  int dim = 0;            // the indexed dim
  Operand data;           // the indexed tensor; strides over `shape`, strides[dim] is its stride along dim
  int64_t data_dim_size = 0;
  Operand index;          // int32 or int64, strides over `shape`
  Operand values;         // gather: the output; scatter_add: the source (same dtype as data)
};

// The first out-of-range index value a kernel met (CPU: returned by the kernel).
struct IndexError {
  bool found = false;
  int64_t value = 0;
  int64_t size = 0;  // the size of the indexed dim it was checked against
};

IndexError gather_cpu(const IndexArgs& args);
// Deterministic: results do not depend on the number of threads.
IndexError scatter_add_cpu(const IndexArgs& args);

// Asynchronous on `stream`; out-of-range indices go to the device error slot.
void gather_cuda(const IndexArgs& args, cuda::Stream stream);
// Atomic adds: the order of floating-point additions varies between runs.
void scatter_add_cuda(const IndexArgs& args, cuda::Stream stream);

// Deterministic scatter_add for any index: sorts the destination offsets
// (stable radix sort) and sums each run of equal offsets in index order, one
// thread per destination. `data` must not overlap itself (no stride-0 dims).
// `workspace` is device memory of scatter_add_sorted_workspace_bytes() bytes,
// 16-byte aligned. data_extent is one past the largest element offset of data.
size_t scatter_add_sorted_workspace_bytes(int64_t count);
void scatter_add_sorted_cuda(const IndexArgs& args, int64_t data_extent, void* workspace, size_t workspace_bytes,
                             cuda::Stream stream);

// Deterministic index_add (the backward of index_select and embedding) over
// contiguous operands: data (outer, data_dim_size, inner) += values (outer,
// count, inner) at rows index (count). Sorts the `count` indices once and
// sums each run of equal indices in index order, one thread per output
// element. `workspace` as above, index_add_sorted_workspace_bytes() bytes.
struct IndexAddArgs {
  void* data = nullptr;
  const void* values = nullptr;
  const void* index = nullptr;
  DType dtype = DType::f32;
  DType index_dtype = DType::i64;
  int64_t outer = 1;
  int64_t count = 0;
  int64_t inner = 1;
  int64_t data_dim_size = 0;
};
size_t index_add_sorted_workspace_bytes(int64_t count);
void index_add_sorted_cuda(const IndexAddArgs& args, void* workspace, size_t workspace_bytes, cuda::Stream stream);

// The CPU's index_add over the same contiguous operands, written with =:
// every row of data (outer, data_dim_size, inner) is the sum of the rows of
// values its indices name, in index order, accumulated in float (double for
// float64) and rounded once; rows no index names are zeros. It buckets the
// indices by row (a counting sort) and splits the rows across threads, so it
// writes the result once (no zero fill first) and takes no locks; the result
// does not depend on the thread count. Reports the first out-of-range index.
IndexError index_add_rows_cpu(const IndexAddArgs& args);

// Reads and clears the device's error slot (synchronizes `stream`).
IndexError index_error_cuda(int device, cuda::Stream stream);

}  // namespace kiln::kernels
