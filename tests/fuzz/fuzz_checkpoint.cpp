// libFuzzer target: trainer checkpoints, read and then loaded into a fresh
// run (model, optimizer and schedule, loss scaler, generators), which then
// trains one step on what it loaded.
//
// Input: one byte that picks the run (CheckpointRun's config), then the
// safetensors JSON header, a 0 byte, and the tensor data. The target writes
// the 8-byte header length itself, so that mutations of the header reach the
// checkpoint's own checks (fuzz_safetensors covers the length field).
#include <algorithm>
#include <cstring>

#include "tests/fuzz/checkpoint_run.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const kiln::fuzz::InputFile input("checkpoint.safetensors");
  const std::string& path = input.path;
  const uint8_t* body = data + 1;
  const uint8_t* body_end = data + size;
  const uint8_t* separator = std::find(body, body_end, uint8_t{0});
  const uint64_t header_size = static_cast<uint64_t>(separator - body);
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(header_size >> (8 * i));
  file.insert(file.end(), body, separator);
  if (separator != body_end) file.insert(file.end(), separator + 1, body_end);
  kiln::fuzz::write_file(path, file.data(), file.size());

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
