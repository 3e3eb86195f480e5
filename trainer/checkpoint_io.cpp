#include "trainer/checkpoint_io.h"

#include <list>

#include "core/generator.h"
#include "core/saved_json.h"
#include "core/serialization.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

namespace {
constexpr const char* kFormat = "kiln-trainer-checkpoint-1";

nlohmann::json generator_states() {
  nlohmann::json states = nlohmann::json::object();
  const GeneratorState cpu = default_generator(Device::cpu()).state();
  states["cpu"] = {cpu.seed, cpu.offset};
  for (int device = 0; device < cuda::device_count(); ++device) {
    const GeneratorState gpu = default_generator(Device::cuda(device)).state();
    states["cuda:" + std::to_string(device)] = {gpu.seed, gpu.offset};
  }
  return states;
}

void restore_generators(const nlohmann::json& states) {
  for (const auto& [name, value] : states.items()) {
    const Device device = Device::parse(name);
    if (device.is_cuda() && device.index >= cuda::device_count()) continue;
    default_generator(device).set_state({value.at(0).get<uint64_t>(), value.at(1).get<uint64_t>()});
  }
}

std::string corrupt_metadata(const std::string& path) { return "load checkpoint '" + path + "': corrupt metadata"; }

// A count of the metadata, in [min, saved_json::kMaxCount]: nlohmann's
// get<int64_t> would convert a float, with undefined behaviour out of range.
// `fallback` is the value of a key that older files lack.
int64_t integer_in(const nlohmann::json& meta, const char* key, int64_t min, const std::string& path,
                   std::optional<int64_t> fallback = std::nullopt) {
  if (!meta.contains(key) && fallback) return *fallback;
  return saved_json::integer_at(meta, key, corrupt_metadata(path), min, saved_json::kMaxCount);
}

bool flag_in(const nlohmann::json& meta, const char* key, const std::string& path) {
  return meta.contains(key) && saved_json::boolean_at(meta, key, corrupt_metadata(path));
}

// The generator states as generator_states() writes them: {device: [seed, offset]}.
void check_generator_states(const nlohmann::json& states, const std::string& path) {
  KILN_CHECK(states.is_object(), "load checkpoint '", path, "': corrupt metadata: \"rng\" is not an object");
  for (const auto& [name, value] : states.items()) {
    try {
      Device::parse(name);
    } catch (const Error& error) {
      KILN_THROW("load checkpoint '", path, "': corrupt generator state: ", error.message());
    }
    KILN_CHECK(value.is_array() && value.size() == 2 && value.at(0).is_number_unsigned() &&
                   value.at(1).is_number_unsigned(),
               "load checkpoint '", path, "': corrupt generator state for ", name, ": ", value.dump(),
               " (expected [seed, offset], two non-negative integers)");
  }
}

// Binary values in the callback states (nlohmann::json::binary: the averaged
// weights of StochasticWeightAveraging, say) are stored in the tensor section as
// 1-D u8 tensors named "callbacks" + their JSON pointer under "callbacks"
// ("callbacks/StochasticWeightAveraging/average_model_state/..."), with null in
// their place in the metadata: the header stays small (Python's safetensors
// refuses headers over 100 MB) and the bytes are stored as they are.
constexpr std::string_view kBlobRoot = "callbacks";  // then the JSON pointer, "/..."

bool is_blob_name(const std::string& name) {
  return name.starts_with(kBlobRoot) && name.size() > kBlobRoot.size() && name[kBlobRoot.size()] == '/';
}

// Moves each binary value under `value` (at `pointer`) into `blobs` (which keeps
// the bytes alive for the tensors over them) and `tensors`.
void move_blobs_to_tensors(nlohmann::json& value, const nlohmann::json::json_pointer& pointer,
                           std::list<nlohmann::json::binary_t>& blobs, NamedTensorList& tensors) {
  if (value.is_binary()) {
    nlohmann::json::binary_t& blob = blobs.emplace_back(std::move(value.get_binary()));
    const auto size = static_cast<int64_t>(blob.size());
    tensors.emplace_back(std::string(kBlobRoot) + pointer.to_string(),
                         blob.empty() ? empty({0}, {.dtype = DType::u8}) : from_blob(blob.data(), {size}, DType::u8));
    value = nullptr;
  } else if (value.is_object()) {
    for (auto& item : value.items()) move_blobs_to_tensors(item.value(), pointer / item.key(), blobs, tensors);
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) move_blobs_to_tensors(value[i], pointer / i, blobs, tensors);
  }
}

// move_blobs_to_tensors' inverse for one tensor: its bytes go back, as a binary
// value, to the null its name points at in `callbacks`.
void restore_blob(nlohmann::json& callbacks, const std::string& name, const Tensor& tensor, const std::string& path) {
  const std::string where = "load checkpoint '" + path + "': tensor '" + name + "'";
  KILN_CHECK(tensor.dtype() == DType::u8 && tensor.dim() == 1, where, " is ", dtype_name(tensor.dtype()), " ",
             shape_str(tensor.shape()), " (expected the 1-D u8 bytes of a callback state)");
  try {
    const nlohmann::json::json_pointer pointer(name.substr(kBlobRoot.size()));
    KILN_CHECK(callbacks.contains(pointer) && callbacks.at(pointer).is_null(), where,
               " does not name a null value of the callback states");
    const Tensor contiguous = tensor.contiguous();
    const auto* bytes = static_cast<const uint8_t*>(contiguous.data_ptr());
    callbacks.at(pointer) = nlohmann::json::binary(std::vector<uint8_t>(bytes, bytes + contiguous.numel()));
  } catch (const nlohmann::json::exception&) {
    KILN_THROW(where, " does not name a null value of the callback states");
  }
}

// Optimizer 0 keeps the single-optimizer names ("optimizer", "scheduler").
std::string slot_name(const char* kind, size_t index) {
  return index == 0 ? std::string(kind) : std::string(kind) + "_" + std::to_string(index);
}
}  // namespace

void save_trainer_checkpoint(const std::string& path, const nn::Module& model,
                             const std::vector<OptimizerSlot>& optimizers, const TrainerCheckpoint& progress,
                             const optim::GradScaler* scaler) {
  NamedTensorList tensors;
  for (const auto& [name, tensor] : model.state_dict()) tensors.emplace_back("model." + name, tensor);
  nlohmann::json meta = {{"format", kFormat},
                         {"model_type", model.type_name()},
                         {"epoch", progress.epoch},
                         {"global_step", progress.global_step},
                         {"batch_in_epoch", progress.batch_in_epoch},
                         {"total_batches", progress.total_batches},
                         {"epoch_end_hooks_done", progress.epoch_end_hooks_done},
                         {"validation_pending", progress.validation_pending},
                         {"loader", progress.loader_state},
                         {"metrics", progress.metrics},
                         {"callbacks", progress.callback_states},
                         {"rng", generator_states()},
                         {"hyperparameters", progress.hyperparameters},
                         {"num_optimizers", optimizers.size()}};
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const std::string optimizer_key = slot_name("optimizer", i), scheduler_key = slot_name("scheduler", i);
    optim::StateDict optimizer_state = optimizers[i].optimizer->state_dict();
    for (const auto& [name, tensor] : optimizer_state.tensors) tensors.emplace_back(optimizer_key + "." + name, tensor);
    meta[optimizer_key] = optimizer_state.meta;
    if (optimizers[i].scheduler != nullptr) {
      optim::StateDict scheduler_state = optimizers[i].scheduler->state_dict();
      for (const auto& [name, tensor] : scheduler_state.tensors) {
        tensors.emplace_back(scheduler_key + "." + name, tensor);
      }
      meta[scheduler_key] = scheduler_state.meta;
    }
  }
  if (scaler != nullptr) {
    optim::StateDict scaler_state = scaler->state_dict();
    for (const auto& [name, tensor] : scaler_state.tensors) tensors.emplace_back("scaler." + name, tensor);
    meta["scaler"] = scaler_state.meta;
  }
  std::list<nlohmann::json::binary_t> blobs;
  move_blobs_to_tensors(meta["callbacks"], nlohmann::json::json_pointer(), blobs, tensors);
  save_safetensors(path, tensors, {{"kiln", meta.dump()}});
}

TrainerCheckpointFile read_trainer_checkpoint(const std::string& path, const nn::Module& model,
                                              size_t num_optimizers) {
  SafetensorsFile file = load_safetensors(path);
  auto it = file.metadata.find("kiln");
  KILN_CHECK(it != file.metadata.end(), "load checkpoint '", path,
             "': not a kiln trainer checkpoint (no \"kiln\" metadata; a weights-only file?)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load checkpoint '", path, "': corrupt metadata: ", error.what());
  }
  KILN_CHECK(meta.is_object(), "load checkpoint '", path, "': corrupt metadata: not a JSON object");
  const nlohmann::json format = meta.contains("format") ? meta.at("format") : nlohmann::json("");
  KILN_CHECK(format == kFormat, "load checkpoint '", path, "': unknown format ", format.dump());
  const nlohmann::json model_type = meta.contains("model_type") ? meta.at("model_type") : nlohmann::json("?");
  KILN_CHECK(model_type == model.type_name(), "load checkpoint '", path, "': it holds a ",
             model_type.is_string() ? model_type.get<std::string>() : model_type.dump(), " but the model is a ",
             model.type_name());
  // Checkpoints written before several optimizers were supported hold one.
  const auto saved_optimizers = static_cast<size_t>(integer_in(meta, "num_optimizers", 0, path, 1));
  KILN_CHECK(saved_optimizers == num_optimizers, "load checkpoint '", path, "': it holds ", saved_optimizers,
             " optimizer(s) but configure_optimizers returned ", num_optimizers);
  TrainerCheckpointFile out;
  out.path = path;
  // Tensor-name prefix ("optimizer_1.") -> where its tensors go.
  std::map<std::string, std::map<std::string, Tensor>*> destinations;
  nlohmann::json callbacks;  // the callback states, with their binary values restored from the tensors
  out.optimizers.resize(saved_optimizers);
  out.schedulers.resize(saved_optimizers);
  try {
    for (size_t i = 0; i < saved_optimizers; ++i) {
      const std::string optimizer_key = slot_name("optimizer", i), scheduler_key = slot_name("scheduler", i);
      out.optimizers[i].meta = saved_json::member(meta, optimizer_key, corrupt_metadata(path));
      destinations[optimizer_key + "."] = &out.optimizers[i].tensors;
      if (meta.contains(scheduler_key)) {
        out.schedulers[i] = optim::StateDict{};
        out.schedulers[i]->meta = meta.at(scheduler_key);
        destinations[scheduler_key + "."] = &out.schedulers[i]->tensors;
      }
    }
    if (meta.contains("scaler")) {
      out.scaler = optim::StateDict{};
      out.scaler->meta = meta.at("scaler");
      destinations["scaler."] = &out.scaler->tensors;
    }
    out.progress.epoch = integer_in(meta, "epoch", 0, path);
    out.progress.global_step = integer_in(meta, "global_step", 0, path);
    out.progress.batch_in_epoch = integer_in(meta, "batch_in_epoch", 0, path);
    out.progress.total_batches = integer_in(meta, "total_batches", -1, path, -1);
    out.progress.epoch_end_hooks_done = flag_in(meta, "epoch_end_hooks_done", path);
    out.progress.validation_pending = flag_in(meta, "validation_pending", path);
    // The loader, metrics and callback states are the Trainer's to check (Trainer::load_checkpoint).
    out.progress.loader_state = saved_json::member(meta, "loader", corrupt_metadata(path));
    out.progress.metrics = meta.value("metrics", nlohmann::json());
    callbacks = saved_json::object(saved_json::member(meta, "callbacks", corrupt_metadata(path)), "callbacks",
                                   corrupt_metadata(path));
    if (meta.contains("hyperparameters")) {
      const std::string where = corrupt_metadata(path) + ": hyperparameters";
      const nlohmann::json& hyperparameters = saved_json::object(meta.at("hyperparameters"), "hyperparameters", where);
      for (const auto& [name, value] : hyperparameters.items()) {
        out.progress.hyperparameters[name] = saved_json::string(value, name, where);
      }
    }
    out.rng = saved_json::member(meta, "rng", corrupt_metadata(path));
    check_generator_states(out.rng, path);
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load checkpoint '", path, "': corrupt metadata: ", error.what());
  }
  for (auto& [name, tensor] : file.tensors) {
    if (name.rfind("model.", 0) == 0) {
      out.model.emplace_back(name.substr(6), tensor);
      continue;
    }
    if (is_blob_name(name)) {
      restore_blob(callbacks, name, tensor, path);
      continue;
    }
    const size_t dot = name.find('.');
    auto destination = dot == std::string::npos ? destinations.end() : destinations.find(name.substr(0, dot + 1));
    KILN_CHECK(destination != destinations.end(), "load checkpoint '", path, "': unexpected tensor '", name, "'");
    (*destination->second)[name.substr(dot + 1)] = tensor;
  }
  for (auto& item : callbacks.items()) out.progress.callback_states[item.key()] = std::move(item.value());
  return out;
}

void load_checkpoint_model(const TrainerCheckpointFile& file, nn::Module& model) {
  // load_state_dict validates every key and shape before writing anything.
  try {
    model.load_state_dict(file.model, /*strict=*/true);
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", file.path, "': the model does not match: ", error.message());
  }
}

void load_checkpoint_optimizers(const TrainerCheckpointFile& file, const std::vector<OptimizerSlot>& optimizers) {
  KILN_CHECK(optimizers.size() == file.optimizers.size(), "load checkpoint '", file.path, "': it holds ",
             file.optimizers.size(), " optimizer(s) but this run has ", optimizers.size());
  for (size_t i = 0; i < optimizers.size(); ++i) {
    const bool saved = file.schedulers[i].has_value(), present = optimizers[i].scheduler != nullptr;
    KILN_CHECK(saved == present, "load checkpoint '", file.path, "': optimizer ", i, " was saved ",
               saved ? "with" : "without", " a learning-rate schedule, but this run has ", present ? "one" : "none");
  }
  try {
    for (size_t i = 0; i < optimizers.size(); ++i) {
      optimizers[i].optimizer->load_state_dict(file.optimizers[i]);
      if (optimizers[i].scheduler != nullptr) optimizers[i].scheduler->load_state_dict(*file.schedulers[i]);
    }
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", file.path, "': the optimizer or schedule does not match: ", error.message());
  }
}

void load_checkpoint_scaler(const TrainerCheckpointFile& file, optim::GradScaler* scaler) {
  if (scaler == nullptr || !file.scaler) return;
  try {
    scaler->load_state_dict(*file.scaler);
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", file.path, "': corrupt loss-scaler state: ", error.message());
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW("load checkpoint '", file.path, "': corrupt loss-scaler state: ", error.what());
  }
}

void load_checkpoint_rng(const TrainerCheckpointFile& file) { restore_generators(file.rng); }

}  // namespace kiln
