// The Trainer's data-parallel seam, after Lightning's Strategy: which process
// this is, where gradients are synchronized, which rank writes files, and how
// metrics and stop decisions are agreed by all ranks.
//
//   "single_device": one process; every call below is local and free.
//   "ddp": one process per device, started by kiln-run (torchrun's
//   environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_*);
//   the model is wrapped in nn::DistributedDataParallel over the default
//   process group (Gloo for CPU tensors, NCCL for CUDA tensors).
//
// Every collective here must be called by all ranks in the same order; the
// Trainer calls them at points every rank reaches (the ranks see the same
// number of batches thanks to DistributedSampler).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/distributed/process_group.h"
#include "nn/ddp.h"
#include "nn/module.h"

namespace kiln {

class Strategy {
 public:
  // Resolves Lightning's flags against the launcher's environment:
  // "auto" is "ddp" when devices * num_nodes > 1. "ddp" with more than one
  // process needs kiln-run, and WORLD_SIZE = devices * num_nodes and
  // LOCAL_WORLD_SIZE = devices. Throws kiln::Error naming the flag otherwise.
  // "ddp_find_unused_parameters_true" is "ddp" allowing parameters without
  // a gradient in a step. No communication.
  Strategy(const std::string& strategy, int devices, int num_nodes);

  const std::string& name() const { return name_; }  // "single_device" or "ddp"
  int global_rank() const { return global_rank_; }
  int local_rank() const { return local_rank_; }
  int world_size() const { return world_size_; }
  bool is_global_zero() const { return global_rank_ == 0; }
  // Whether the collectives below communicate: "ddp" under a launcher (a
  // launched group of one included: it runs the same code path, e.g. NCCL
  // on a one-GPU machine).
  bool distributed() const { return launched_; }
  bool find_unused_parameters() const { return find_unused_parameters_; }

  // Joins the default process group, making it from the environment when
  // there is none (collective, once). Nothing unless distributed().
  void setup_environment();
  const std::shared_ptr<distributed::ProcessGroup>& process_group() const { return group_; }

  // Wraps `model` (already on its device and dtype) in DistributedDataParallel,
  // which broadcasts rank 0's parameters and buffers (collective). Nothing
  // unless distributed(). `model` must outlive the wrapper (release_model).
  void wrap_model(nn::Module& model, bool find_unused_parameters);
  void release_model() { ddp_.reset(); }
  // The wrapper (null unless distributed(), or outside fit).
  nn::DistributedDataParallel* ddp() const { return ddp_.get(); }

  // --- collectives (identity unless distributed())
  // Whether any rank's flag is set, per flag (all-reduce max).
  std::vector<bool> reduce_any(const std::vector<bool>& flags);
  // Sums `values` over the ranks. `names` must be the same on every rank (one
  // small extra all-reduce checks it): throws kiln::Error naming the difference.
  std::vector<double> sum_over_ranks(const std::vector<std::string>& names, std::vector<double> values);
  // Rank 0's `text` on every rank.
  std::string broadcast_string(const std::string& text);
  void barrier();

 private:
  std::string name_ = "single_device";
  int global_rank_ = 0, local_rank_ = 0, world_size_ = 1;
  bool find_unused_parameters_ = false;
  bool launched_ = false;
  std::shared_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<nn::DistributedDataParallel> ddp_;
};

}  // namespace kiln
