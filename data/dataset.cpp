#include "data/dataset.h"

#include <cstring>

namespace kiln {

void check_example_index(const Dataset& dataset, int64_t index) {
  KILN_CHECK(index >= 0 && index < dataset.size(), dataset.name(), ": example index ", index, " out of range [0, ",
             dataset.size(), ")");
}

ExampleLayout Dataset::layout() const {
  KILN_CHECK(size() > 0, name(), ": layout() of an empty data set (override layout())");
  Example example = get(0);
  KILN_CHECK(example.input.defined() && example.target.defined(), name(), ": get(0) returned an undefined tensor");
  return ExampleLayout{{example.input.shape(), example.input.dtype()}, {example.target.shape(), example.target.dtype()}};
}

namespace {
void copy_field(const Tensor& value, const FieldLayout& field, void* destination, const char* what,
                const std::string& dataset, int64_t index) {
  KILN_CHECK(value.defined() && value.shape() == field.shape && value.dtype() == field.dtype, dataset,
             ": example ", index, " has ", what, " ",
             value.defined() ? shape_str(value.shape()) + " " + std::string(dtype_name(value.dtype())) : "undefined",
             " but the data set's layout says ", shape_str(field.shape), " ", dtype_name(field.dtype));
  Tensor dense = value.is_cpu() ? value.contiguous() : value.cpu().contiguous();
  std::memcpy(destination, dense.data_ptr(), field.nbytes());
}
}  // namespace

void Dataset::get_into(int64_t index, void* input, void* target) const {
  // Generic path for data sets without an allocation-free override.
  Example example = get(index);
  ExampleLayout expected = layout();
  copy_field(example.input, expected.input, input, "input", name(), index);
  copy_field(example.target, expected.target, target, "target", name(), index);
}

// ---------------------------------------------------------------- TensorDataset

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) {
  KILN_CHECK(inputs.defined() && targets.defined(), "TensorDataset: inputs and targets must be defined tensors");
  KILN_CHECK(inputs.dim() >= 1 && targets.dim() >= 1, "TensorDataset: expected tensors with a first (example) dim, got inputs ",
             shape_str(inputs.shape()), " and targets ", shape_str(targets.shape()));
  KILN_CHECK(inputs.size(0) == targets.size(0), "TensorDataset: inputs ", shape_str(inputs.shape()), " and targets ",
             shape_str(targets.shape()), " have different first dims (example counts)");
  inputs_ = (inputs.is_cpu() ? inputs : inputs.cpu()).contiguous().detach();
  targets_ = (targets.is_cpu() ? targets : targets.cpu()).contiguous().detach();
  layout_.input = {Shape(inputs_.shape().begin() + 1, inputs_.shape().end()), inputs_.dtype()};
  layout_.target = {Shape(targets_.shape().begin() + 1, targets_.shape().end()), targets_.dtype()};
}

Example TensorDataset::get(int64_t index) const {
  check_example_index(*this, index);
  return Example{inputs_.select(0, index).clone(), targets_.select(0, index).clone()};
}

void TensorDataset::get_into(int64_t index, void* input, void* target) const {
  check_example_index(*this, index);
  const size_t input_bytes = layout_.input.nbytes(), target_bytes = layout_.target.nbytes();
  std::memcpy(input, static_cast<const char*>(inputs_.data_ptr()) + index * input_bytes, input_bytes);
  std::memcpy(target, static_cast<const char*>(targets_.data_ptr()) + index * target_bytes, target_bytes);
}

}  // namespace kiln
