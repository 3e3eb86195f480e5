// libFuzzer target: trainer checkpoints, read and then loaded into a fresh
// run (model, optimizer and schedule, loss scaler, generators), which then
// trains one step on what it loaded.
//
// Input: one byte that picks the run (CheckpointRun's config), then the
// safetensors JSON header, a 0 byte, and the tensor data
// (fuzz_support.h's write_safetensors_input).

#include "tests/fuzz/checkpoint_run.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const kiln::fuzz::InputFile input("checkpoint.safetensors");
  const std::string& path = input.path;
  kiln::fuzz::write_safetensors_input(path, data + 1, data + size);

  kiln::fuzz::CheckpointRun run(data[0]);
  try {
    const kiln::TrainerCheckpointFile checkpoint = kiln::read_trainer_checkpoint(path, *run.model, 1);
    kiln::load_checkpoint_model(checkpoint, *run.model);
    kiln::load_checkpoint_optimizers(checkpoint, run.slots());
    kiln::load_checkpoint_scaler(checkpoint, &run.scaler);
    kiln::load_checkpoint_rng(checkpoint);
  } catch (const kiln::Error& error) {
    kiln::fuzz::require_names_file(error, path);
    return 0;
  }
  // A checkpoint that loaded must train (its values may be absurd, not its structure).
  run.train_step();
  return 0;
}
