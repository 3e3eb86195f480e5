#include "tests/support/trainer_fixtures.h"

#include <unistd.h>

#include "core/generator.h"
#include "core/ops.h"

namespace kiln::testing {

std::filesystem::path fresh_folder(const std::string& prefix, const std::string& name) {
  const std::filesystem::path folder =
      std::filesystem::temp_directory_path() / ("kiln_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder;
}

std::shared_ptr<TensorDataset> regression_data(int64_t count, double noise) {
  manual_seed(11);
  Tensor x = randn({count, 4});
  Tensor w = tensor<float>({1, -2, 0.5, 3}, {4, 1});
  Tensor y = add(matmul(x, w), mul(randn({count, 1}), noise));
  return std::make_shared<TensorDataset>(x, y);
}

TrainerOptions quiet_trainer_options(const std::filesystem::path& root) {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.default_root_dir = root.string();
  options.enable_progress_bar = false;
  options.num_sanity_val_steps = 0;
  options.deterministic = true;
  return options;
}

DataLoaderOptions seeded_loader_options(int64_t batch_size, bool shuffle) {
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = shuffle;
  options.seed = 5;
  return options;
}

}  // namespace kiln::testing
