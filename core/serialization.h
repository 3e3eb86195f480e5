// safetensors files: 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}},
// then raw little-endian tensor data. Readable by the safetensors library and
// therefore by PyTorch.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsFile {
  NamedTensorList tensors;  // on the cpu, in file order
  std::map<std::string, std::string> metadata;
};

// Writes atomically: a temporary file in the same folder, fsync, rename over
// `path`, fsync of the folder. An existing file at `path` stays intact until
// the new one is durable. Tensors on any device are copied to the host.
// Throws kiln::Error naming the path on any I/O failure (the temporary is removed).
void save_safetensors(const std::string& path, const NamedTensorList& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a file: header length, JSON, dtypes, shapes against
// data offsets, offsets inside the data and not overlapping, no trailing
// bytes, BOOL bytes 0 or 1. Throws kiln::Error naming the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace kiln
