// Datasets: a size and random access to examples. An example is an (input,
// target) pair of CPU tensors; a batch stacks examples along a new first dim.
//
// The DataLoader does not call get() on its hot path: it asks the data set to
// write example i straight into the batch buffer (get_into), so an in-memory
// data set collates with no per-example heap allocation. dense() exposes the
// whole data set for GPU-resident loading.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace kiln {

struct Example {
  Tensor input;
  Tensor target;
};

// A collated batch: input (B, ...) and target (B, ...). For Fashion-MNIST:
// input float32 (B, 1, 28, 28) normalized, target int64 (B).
struct Batch {
  Tensor input;
  Tensor target;
  int64_t size() const { return input.defined() ? input.size(0) : 0; }
};

// Shape and dtype of one field of one example (without the batch dim).
struct FieldLayout {
  Shape shape;
  DType dtype = DType::f32;
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
};

struct ExampleLayout {
  FieldLayout input;
  FieldLayout target;
};

// The whole data set as tensors for GPU-resident loading: example i is
// inputs[i] * input_scale (converted to the layout's input dtype) and
// targets[i] (converted to the layout's target dtype). CPU, contiguous.
struct DenseData {
  Tensor inputs;       // (N, ...input shape), any dtype the gather kernel reads (uint8, float32)
  Tensor targets;      // (N, ...target shape)
  float input_scale = 1.0f;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of examples.
  virtual int64_t size() const = 0;
  // Example `index` as new tensors; throws kiln::Error when index is out of range.
  virtual Example get(int64_t index) const = 0;
  // Shapes and dtypes of every example (what get() returns). The default
  // calls get(0); data sets override it.
  virtual ExampleLayout layout() const;
  // Writes example `index` into contiguous memory laid out as layout():
  // `input` holds layout().input.nbytes(), `target` layout().target.nbytes().
  // The default calls get() and copies; in-memory data sets override it with
  // an allocation-free copy. Must be safe to call from several threads.
  virtual void get_into(int64_t index, void* input, void* target) const;
  // The whole data set as tensors when it is held in memory, else nullopt.
  virtual std::optional<DenseData> dense() const { return std::nullopt; }
  // Used in error messages.
  virtual std::string name() const { return "Dataset"; }
};

// Examples are rows of two tensors with the same first dim (torch's
// TensorDataset). Both are made contiguous CPU tensors at construction.
class TensorDataset : public Dataset {
 public:
  // Throws kiln::Error when a tensor is undefined, 0-dimensional or the first dims differ.
  TensorDataset(Tensor inputs, Tensor targets);

  int64_t size() const override { return inputs_.size(0); }
  Example get(int64_t index) const override;
  ExampleLayout layout() const override { return layout_; }
  void get_into(int64_t index, void* input, void* target) const override;
  std::optional<DenseData> dense() const override { return DenseData{inputs_, targets_, 1.0f}; }
  std::string name() const override { return "TensorDataset"; }

  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  ExampleLayout layout_;
};

// Throws kiln::Error naming the data set when index is not in [0, size).
void check_example_index(const Dataset& dataset, int64_t index);

}  // namespace kiln
