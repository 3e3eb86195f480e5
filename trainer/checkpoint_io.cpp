#include "trainer/checkpoint_io.h"

#include "core/generator.h"
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
}  // namespace

void save_trainer_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer& optimizer,
                             const optim::LRScheduler* scheduler, const TrainerCheckpoint& progress) {
  NamedTensorList tensors;
  for (const auto& [name, tensor] : model.state_dict()) tensors.emplace_back("model." + name, tensor);
  optim::StateDict optimizer_state = optimizer.state_dict();
  for (const auto& [name, tensor] : optimizer_state.tensors) tensors.emplace_back("optimizer." + name, tensor);
  nlohmann::json meta = {{"format", kFormat},
                         {"model_type", model.type_name()},
                         {"epoch", progress.epoch},
                         {"global_step", progress.global_step},
                         {"batch_in_epoch", progress.batch_in_epoch},
                         {"loader", progress.loader_state},
                         {"callbacks", progress.callback_states},
                         {"rng", generator_states()},
                         {"hyperparameters", progress.hyperparameters},
                         {"optimizer", optimizer_state.meta}};
  if (scheduler != nullptr) {
    optim::StateDict scheduler_state = scheduler->state_dict();
    for (const auto& [name, tensor] : scheduler_state.tensors) tensors.emplace_back("scheduler." + name, tensor);
    meta["scheduler"] = scheduler_state.meta;
  }
  save_safetensors(path, tensors, {{"kiln", meta.dump()}});
}

TrainerCheckpoint load_trainer_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& optimizer,
                                          optim::LRScheduler* scheduler) {
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
  KILN_CHECK(meta.value("format", "") == kFormat, "load checkpoint '", path, "': unknown format '",
             meta.value("format", ""), "'");
  KILN_CHECK(meta.value("model_type", "") == model.type_name(), "load checkpoint '", path, "': it holds a ",
             meta.value("model_type", "?"), " but the model is a ", model.type_name());
  KILN_CHECK(meta.contains("scheduler") == (scheduler != nullptr), "load checkpoint '", path, "': it was written ",
             meta.contains("scheduler") ? "with" : "without", " a learning-rate schedule, but this run has ",
             scheduler != nullptr ? "one" : "none");
  nn::StateDict model_state;
  optim::StateDict optimizer_state, scheduler_state;
  optimizer_state.meta = meta.at("optimizer");
  if (scheduler != nullptr) scheduler_state.meta = meta.at("scheduler");
  for (auto& [name, tensor] : file.tensors) {
    if (name.rfind("model.", 0) == 0) {
      model_state.emplace_back(name.substr(6), tensor);
    } else if (name.rfind("optimizer.", 0) == 0) {
      optimizer_state.tensors[name.substr(10)] = tensor;
    } else if (name.rfind("scheduler.", 0) == 0) {
      scheduler_state.tensors[name.substr(10)] = tensor;
    } else {
      KILN_THROW("load checkpoint '", path, "': unexpected tensor '", name, "'");
    }
  }
  // load_state_dict validates every key and shape before writing anything.
  try {
    model.load_state_dict(model_state, /*strict=*/true);
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", path, "': the model does not match: ", error.message());
  }
  try {
    optimizer.load_state_dict(optimizer_state);
    if (scheduler != nullptr) scheduler->load_state_dict(scheduler_state);
  } catch (const Error& error) {
    KILN_THROW("load checkpoint '", path, "': the optimizer or schedule does not match: ", error.message());
  }
  restore_generators(meta.at("rng"));
  TrainerCheckpoint progress;
  progress.epoch = meta.at("epoch").get<int64_t>();
  progress.global_step = meta.at("global_step").get<int64_t>();
  progress.batch_in_epoch = meta.at("batch_in_epoch").get<int64_t>();
  progress.loader_state = meta.at("loader");
  progress.callback_states = meta.at("callbacks").get<std::map<std::string, nlohmann::json>>();
  progress.hyperparameters = meta.value("hyperparameters", std::map<std::string, std::string>{});
  return progress;
}

}  // namespace kiln
