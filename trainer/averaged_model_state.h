// An AveragedModel's state inside a callback's state_dict (the weight-averaging
// callbacks: StochasticWeightAveraging, WeightAveraging/EMAWeightAveraging):
// {"meta": AveragedModel's meta, "tensors": {name: tensor}}, each tensor as
// {"dtype", "shape", "data": its little-endian bytes as a JSON binary value},
// exact, which a checkpoint keeps in its tensor section (callbacks.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

#include "nn/module.h"
#include "optim/optimizer.h"

namespace kiln {

// The averaged model's state_dict as JSON (copies the tensors to the host).
nlohmann::json averaged_model_json(const optim::StateDict& average);

// averaged_model_json's inverse, every part checked before anything is
// allocated; kiln::Error naming `where` and the part otherwise. Tensor bytes
// written as base64 text by older files still load.
optim::StateDict read_averaged_model_json(const nlohmann::json& json, std::string_view where);

// Throws kiln::Error (starting with `who`) unless `average` holds exactly the
// model's parameters ("param.<name>") and buffers ("buffer.<name>"), each with
// the model's shape and the dtype AveragedModel keeps for it.
void check_averaged_model_fits(const optim::StateDict& average, const nn::Module& model, std::string_view who);

}  // namespace kiln
