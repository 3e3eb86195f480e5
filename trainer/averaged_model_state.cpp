#include "trainer/averaged_model_state.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/extent.h"
#include "core/saved_json.h"

namespace kiln {

namespace {
// Read only: files written before the average was saved as binary held it as base64 text.
constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::vector<unsigned char> base64_decode(const std::string& text, const std::string& where) {
  KILN_CHECK(text.size() % 4 == 0, where, ": corrupt tensor data (base64 length ", text.size(), ")");
  std::vector<unsigned char> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t chunk = 0;
    int padding = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[i + k];
      const char* found = c == '=' ? nullptr : std::strchr(kBase64, c);
      KILN_CHECK(c == '=' || (found != nullptr && c != '\0'), where, ": corrupt tensor data (base64 character ",
                 static_cast<int>(static_cast<unsigned char>(c)), ")");
      padding += c == '=';
      chunk = (chunk << 6) | (found ? static_cast<uint32_t>(found - kBase64) : 0);
    }
    out.push_back(static_cast<unsigned char>(chunk >> 16));
    if (padding < 2) out.push_back(static_cast<unsigned char>(chunk >> 8));
    if (padding < 1) out.push_back(static_cast<unsigned char>(chunk));
  }
  return out;
}

// A tensor as {"dtype", "shape", "data": its little-endian bytes as a JSON
// binary value}: exact; a checkpoint stores the bytes in its tensor section.
nlohmann::json tensor_json(const Tensor& tensor) {
  const Tensor host = tensor.detach().to(Device::cpu()).contiguous();
  const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
  return {{"dtype", std::string(dtype_name(host.dtype()))},
          {"shape", host.shape()},
          {"data", nlohmann::json::binary(std::vector<uint8_t>(bytes, bytes + host.nbytes()))}};
}

// tensor_json's inverse; the shape and the byte count are checked before anything is allocated.
Tensor tensor_from_json(const nlohmann::json& json, const std::string& name, std::string_view load_where) {
  const std::string where = std::string(load_where) + ": tensor '" + name + "'";
  saved_json::object(json, name, load_where);
  const nlohmann::json& saved_shape = saved_json::member(json, "shape", where);
  if (!saved_shape.is_array()) saved_json::refuse(saved_shape, "shape", where, "a list of sizes >= 0");
  Shape shape;
  for (const nlohmann::json& size : saved_shape) {
    if (!size.is_number_integer() || size.get<int64_t>() < 0) {
      saved_json::refuse(saved_shape, "shape", where, "a list of sizes >= 0");
    }
    shape.push_back(size.get<int64_t>());
  }
  const std::string dtype_text = saved_json::string_at(json, "dtype", where);
  DType dtype = DType::f32;
  try {
    dtype = parse_dtype(dtype_text);
  } catch (const Error& error) {
    KILN_THROW(where, ": ", error.message());
  }
  const nlohmann::json& data = saved_json::member(json, "data", where);
  if (!data.is_binary() && !data.is_string()) saved_json::refuse(data, "data", where, "the tensor's bytes");
  std::vector<unsigned char> decoded;  // files that held base64 text
  if (data.is_string()) decoded = base64_decode(data.get<std::string>(), where);
  const std::vector<unsigned char>& bytes =
      data.is_binary() ? static_cast<const std::vector<unsigned char>&>(data.get_binary()) : decoded;
  const auto extent = contiguous_extent(shape, static_cast<int64_t>(dtype_size(dtype)));
  KILN_CHECK(extent && static_cast<uint64_t>(extent->nbytes) == bytes.size(), where, " has ", bytes.size(),
             " bytes of data, its shape ", shape_str(shape), " needs ",
             extent ? std::to_string(extent->nbytes) : std::string("more than 2^63"));
  if (dtype == DType::b8) {  // any other byte is no bool
    for (unsigned char byte : bytes) KILN_CHECK(byte <= 1, where, " holds a bool other than 0 or 1");
  }
  Tensor tensor = empty(shape, {.dtype = dtype});
  if (!bytes.empty()) std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
  return tensor;
}

// The dtype AveragedModel keeps for a model tensor of `dtype` (optim/swa.h).
DType kept_dtype(DType dtype) {
  if (!is_floating(dtype)) return dtype;
  return dtype == DType::f64 ? DType::f64 : DType::f32;
}
}  // namespace

nlohmann::json averaged_model_json(const optim::StateDict& average) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, tensor] : average.tensors) tensors[name] = tensor_json(tensor);
  return {{"meta", average.meta}, {"tensors", tensors}};
}

optim::StateDict read_averaged_model_json(const nlohmann::json& json, std::string_view load_where) {
  const nlohmann::json& average = saved_json::object(json, "average_model_state", load_where);
  const std::string where = std::string(load_where) + ": average_model_state";
  const nlohmann::json& meta = saved_json::object(saved_json::member(average, "meta", where), "meta", where);
  const std::string averager = saved_json::string_at(meta, "averager", where);
  KILN_CHECK(averager == "AveragedModel", where, ": the average is a '", averager,
             "' state (expected an AveragedModel's)");
  saved_json::integer_at(meta, "n_averaged", where, 0);
  optim::StateDict state{meta, {}};
  const nlohmann::json& tensors = saved_json::member(average, "tensors", where);
  for (const auto& [name, tensor] : saved_json::object(tensors, "tensors", where).items()) {
    state.tensors[name] = tensor_from_json(tensor, name, load_where);
  }
  return state;
}

void check_averaged_model_fits(const optim::StateDict& average, const nn::Module& model, std::string_view who) {
  size_t expected = 0;
  for (const auto& [prefix, named] : {std::pair{"param.", model.named_parameters()},
                                      std::pair{"buffer.", model.named_buffers()}}) {
    for (const auto& [name, tensor] : named) {
      ++expected;
      auto it = average.tensors.find(prefix + name);
      KILN_CHECK(it != average.tensors.end() && it->second.shape() == tensor.shape() &&
                     it->second.dtype() == kept_dtype(tensor.dtype()),
                 who, ": the saved average's '", prefix, name, "' is missing or has another shape or dtype than ",
                 "the model's (", shape_str(tensor.shape()), " ", dtype_name(kept_dtype(tensor.dtype())), ")");
    }
  }
  KILN_CHECK(average.tensors.size() == expected, who, ": the saved average holds ", average.tensors.size(),
             " tensors, the model has ", expected, " parameters and buffers");
}

}  // namespace kiln
