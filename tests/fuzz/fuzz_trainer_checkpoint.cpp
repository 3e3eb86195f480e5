// libFuzzer target: the whole of fit(ckpt_path) for trainer checkpoints. The
// input becomes a checkpoint file that TrainerRun (trainer_run.h: a tiny CPU
// regression with EarlyStopping, ModelCheckpoint, Timer, SWA and a DataLoader)
// resumes and trains on for a few steps, so that the Trainer's own parts of the
// checkpoint (progress, logged metrics, callback and loader states) are read,
// applied and used. Every kiln::Error must name the file; anything else is a finding.
//
// Input: the safetensors JSON header, a 0 byte, and the tensor data (the
// target writes the 8-byte header length: fuzz_support.h write_safetensors_input).
#include <filesystem>

#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/trainer_run.h"

namespace {
// Where ModelCheckpoint writes: one folder per process, removed at exit.
struct RunFolder {
  RunFolder() : path(std::filesystem::path(kiln::fuzz::InputFile("trainer-run").path)) {}
  ~RunFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  const std::filesystem::path path;
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::fuzz::InputFile input("trainer-checkpoint.safetensors");
  static const RunFolder folder;
  const std::string& path = input.path;
  kiln::fuzz::write_safetensors_input(path, data, data + size);

  kiln::fuzz::TrainerRun run(folder.path, /*max_steps=*/5);
  try {
    run.fit(path);
  } catch (const kiln::Error& error) {
    kiln::fuzz::require_names_file(error, path);
  }
  return 0;
}
