// Checked sizes of contiguous tensors. A shape whose element count, byte count
// or outermost stride does not fit in int64 must be refused before anything is
// allocated or indexed: file readers take shapes from untrusted headers, and an
// overflowed product would silently size a buffer too small.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace kiln {

struct ContiguousExtent {
  int64_t numel;   // the product of the sizes
  int64_t nbytes;  // numel times the element size
};

// nullopt when a size is negative, or when the product of the sizes with zeros
// counted as 1 (an empty tensor's outermost contiguous stride) or the byte count
// does not fit in int64. shape_numel and empty() refuse such shapes with it.
std::optional<ContiguousExtent> contiguous_extent(const Shape& shape, int64_t element_size);

}  // namespace kiln
