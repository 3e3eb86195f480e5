// The model, data and single-process reference of the data-parallel tests
// (test_distributed.cpp, test_distributed_netns.cpp): workers train it under
// DDP on their rows of each step's global batch and write "buckets N" and
// their parameters; the parent compares those with one process on the whole batch.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/distributed/process_group.h"
#include "nn/layers.h"
#include "optim/optimizer.h"

namespace kiln::testing::ddp_reference {

constexpr int64_t kIn = 5, kHidden = 7, kOut = 3;

// Linear -> [BatchNorm1d | SyncBatchNorm over `sync_group`] -> Tanh -> Linear.
std::shared_ptr<nn::Sequential> make_model(uint64_t seed, DType dtype, bool batch_norm = false,
                                           std::shared_ptr<distributed::ProcessGroup> sync_group = nullptr);
// Rows [begin, begin + rows) of step `step`'s global batch: x (rows, kIn), y (rows, kOut).
std::pair<Tensor, Tensor> batch(int step, int64_t begin, int64_t rows, int64_t total_rows, DType dtype);
// Every parameter and buffer value, 17 digits (every bit of a double).
std::string param_values(const nn::Module& model);
std::unique_ptr<optim::SGD> make_sgd(nn::Module& model);

// What each worker of a run left: its result file, its log and its exit status.
struct WorkerRun {
  std::vector<std::string> results, logs;
  std::vector<int> statuses;
  double seconds = 0;
  std::string describe() const;
};

// Single-process SGD on the concatenated batch (what DDP must reproduce).
std::vector<double> reference_params(DType dtype, int world, int steps, int micro, bool batch_norm = false);
// Every rank's "buckets N" (N >= min_buckets) and parameters equal the
// reference: exactly up to 1e-10 in float64, within the fp32 parity tolerance in float32.
void check_matches_reference(const WorkerRun& run, DType dtype, int world, int steps, int micro, int64_t min_buckets,
                             bool batch_norm = false);

}  // namespace kiln::testing::ddp_reference
