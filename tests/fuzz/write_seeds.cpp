// Writes the fuzz targets' seed corpora: small valid files of each format,
// made by kiln's own writers (and zlib for the gzip IDX files).
//   kiln_fuzz_seeds OUT   ->  OUT/idx/*, OUT/safetensors/*, OUT/checkpoint/*, OUT/trainer_checkpoint/*
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/generator.h"
#include "core/serialization.h"
#include "tests/fuzz/checkpoint_run.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/fuzz/trainer_run.h"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

void write(const fs::path& path, const Bytes& bytes) {
  kiln::fuzz::write_file(path.string(), bytes.data(), bytes.size());
}

Bytes read(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(file), {});
}

Bytes idx_file(uint8_t type, const std::vector<uint32_t>& dims, size_t element_size) {
  Bytes bytes{0, 0, type, static_cast<uint8_t>(dims.size())};
  size_t count = 1;
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(d >> shift));
    count *= d;
  }
  for (size_t i = 0; i < count * element_size; ++i) bytes.push_back(static_cast<uint8_t>(i * 37 + 1));
  return bytes;
}

Bytes gzip(const Bytes& raw) {
  z_stream stream{};
  deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&stream, raw.size()) + 64);
  stream.next_in = const_cast<Bytef*>(raw.data());
  stream.avail_in = static_cast<uInt>(raw.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

Bytes with_prefix(uint8_t first, const Bytes& rest) {
  Bytes bytes{first};
  bytes.insert(bytes.end(), rest.begin(), rest.end());
  return bytes;
}

void write_idx_seeds(const fs::path& folder) {
  // Role byte 0 any, 1 images, 2 labels (fuzz_idx.cpp).
  const std::vector<std::pair<std::string, Bytes>> files = {
      {"images", with_prefix(1, idx_file(0x08, {2, 3, 3}, 1))}, {"labels", with_prefix(2, idx_file(0x08, {4}, 1))},
      {"int8", with_prefix(0, idx_file(0x09, {3}, 1))},         {"int16", with_prefix(0, idx_file(0x0B, {2, 2}, 2))},
      {"int32", with_prefix(0, idx_file(0x0C, {3}, 4))},        {"float32", with_prefix(0, idx_file(0x0D, {2}, 4))},
      {"float64", with_prefix(0, idx_file(0x0E, {1, 2}, 8))}};
  for (const auto& [name, bytes] : files) {
    write(folder / name, bytes);
    write(folder / (name + ".gz"), with_prefix(bytes[0], gzip(Bytes(bytes.begin() + 1, bytes.end()))));
  }
}

void write_safetensors_seeds(const fs::path& folder) {
  using kiln::tensor;
  write(folder / "empty", {});
  const fs::path file = folder / "weights";
  kiln::save_safetensors(file.string(),
                         {{"layer.weight", tensor<float>({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2})},
                          {"step", tensor<int64_t>({7}, {})},
                          {"half", tensor<double>({0.1, 0.2}, {2}).to(kiln::DType::f16)},
                          {"bf", tensor<double>({0.5}, {1, 1}).to(kiln::DType::bf16)},
                          {"mask", tensor<float>({1, 0, 1}, {3}).to(kiln::DType::b8)},
                          {"bytes", tensor<float>({1, 2}, {2}).to(kiln::DType::u8)},
                          {"i32", tensor<int32_t>({-3}, {1})},
                          {"f64", tensor<double>({2.5}, {1})}},
                         {{"format", "pt"}, {"epoch", "3"}});
  kiln::save_safetensors((folder / "metadata-only").string(), {}, {{"a", "b"}});
}

// The checkpoint target's layout: config byte, JSON header, 0 byte, data.
void write_checkpoint_seeds(const fs::path& folder) {
  for (int config = 0; config < kiln::fuzz::kCheckpointConfigs; ++config) {
    kiln::manual_seed(1);
    kiln::fuzz::CheckpointRun run(config);
    run.train_step();
    run.train_step();
    kiln::TrainerCheckpoint progress;
    progress.epoch = 1;
    progress.global_step = 2;
    progress.batch_in_epoch = 0;
    progress.total_batches = 2;
    progress.loader_state = {{"epoch", 1}, {"seed", 5}};
    progress.metrics = {{"train_loss", 0.25}};
    progress.callback_states = {{"ModelCheckpoint", {{"best_model_path", ""}}}};
    progress.hyperparameters = {{"lr", "0.01"}};
    const fs::path file = folder / ("saved-" + std::to_string(config));
    kiln::save_trainer_checkpoint(file.string(), *run.model, run.slots(), progress, &run.scaler);
    const Bytes saved = read(file);
    fs::remove(file);
    uint64_t header_size = 0;
    for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(saved[i]) << (8 * i);
    Bytes seed{static_cast<uint8_t>(config)};
    seed.insert(seed.end(), saved.begin() + 8, saved.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
    seed.push_back(0);
    seed.insert(seed.end(), saved.begin() + 8 + static_cast<std::ptrdiff_t>(header_size), saved.end());
    write(folder / ("config-" + std::to_string(config)), seed);
  }
}

// A safetensors file in fuzz_trainer_checkpoint's layout: JSON header, 0 byte, data.
Bytes header_zero_data(const Bytes& saved) {
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(saved[i]) << (8 * i);
  const auto header_end = saved.begin() + 8 + static_cast<std::ptrdiff_t>(header_size);
  Bytes seed(saved.begin() + 8, header_end);
  seed.push_back(0);
  seed.insert(seed.end(), header_end, saved.end());
  return seed;
}

// Checkpoints of TrainerRun's fit: mid-epoch 0 (step 2, from a callback) and
// at the end of epoch 0 (step 4, ModelCheckpoint's), with every callback's state.
void write_trainer_checkpoint_seeds(const fs::path& folder) {
  struct SaveAtStep2 : kiln::Callback {
    explicit SaveAtStep2(std::string path) : path(std::move(path)) {}
    std::string name() const override { return "SaveAtStep2"; }
    void on_train_batch_end(kiln::Trainer& trainer, kiln::TrainModule&, int64_t) override {
      if (trainer.global_step() == 2) trainer.save_checkpoint(path);
    }
    std::string path;
  };
  const fs::path scratch = folder / "scratch";
  const fs::path mid_epoch = scratch / "mid-epoch.safetensors";
  fs::create_directories(scratch);
  kiln::fuzz::TrainerRun run(scratch, /*max_steps=*/4);
  run.fit("", {std::make_shared<SaveAtStep2>(mid_epoch.string())});
  write(folder / "mid-epoch", header_zero_data(read(mid_epoch)));
  for (const auto& entry : fs::directory_iterator(scratch / "checkpoints")) {
    write(folder / ("epoch-end-" + entry.path().stem().string()), header_zero_data(read(entry.path())));
  }
  fs::remove_all(scratch);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_FOLDER (writes OUT/idx, OUT/safetensors, OUT/checkpoint, OUT/trainer_checkpoint)\n",
                 argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  for (const char* name : {"idx", "safetensors", "checkpoint", "trainer_checkpoint"}) fs::create_directories(out / name);
  write_idx_seeds(out / "idx");
  write_safetensors_seeds(out / "safetensors");
  write_checkpoint_seeds(out / "checkpoint");
  write_trainer_checkpoint_seeds(out / "trainer_checkpoint");
  std::printf("seed corpora written to %s/{idx,safetensors,checkpoint,trainer_checkpoint}\n", out.string().c_str());
  return 0;
}
