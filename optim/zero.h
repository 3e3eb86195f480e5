// ZeroRedundancyOptimizer: torch.distributed.optim.ZeroRedundancyOptimizer's
// name and semantics (ZeRO stage 1, as llm.c's ZeRO-1: the optimizer state is
// sharded, the gradients and parameters are not).
//
// The parameters are partitioned among the ranks of a process group, whole
// tensors to one rank each: within every parameter group, largest first, to
// the rank that owns the fewest bytes so far (torch's rule), the same on
// every rank. Each rank builds, with `make_optimizer`, an ordinary optimizer
// over only the parameters it owns, so it keeps about 1/N of the optimizer
// state (exactly 1/N when the sizes split evenly). step() updates the owned
// parameters from their gradients, which must already be the same on every
// rank (averaged by DistributedDataParallel), then all-gathers the parameters
// so that every rank holds every updated value: the result is plain DDP's.
//
// Checkpoints hold the full state: consolidate_state_dict(to) gathers it on
// rank `to`, where state_dict() returns exactly the state a plain optimizer
// over all the parameters would have (its indices, groups and names), so it
// loads into a plain optimizer, or into a ZeroRedundancyOptimizer of any world
// size: load_state_dict takes the full state on every rank and keeps its shard.
//
// Every call marked collective must be made by every rank, in the same order.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/distributed/process_group.h"
#include "optim/optimizer.h"

namespace kiln::optim {

// Builds the optimizer of one rank's shard: the groups keep the given
// hyperparameters, some may be empty (never all).
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)>;

class ZeroRedundancyOptimizer {
 public:
  // Partitions `groups` over `process_group` (null: the default group) and
  // builds this rank's optimizer. No communication. Throws kiln::Error when a
  // rank would own no parameter (fewer parameters than ranks), when a
  // parameter is undefined, appears twice or is not on one device with the
  // others, or when the factory returns an optimizer over other parameters.
  ZeroRedundancyOptimizer(std::vector<ParamGroup> groups, const OptimizerFactory& make_optimizer,
                          std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);
  ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerFactory& make_optimizer,
                          std::shared_ptr<distributed::ProcessGroup> process_group = nullptr);

  // Collective. Updates the parameters this rank owns, then all-gathers every
  // parameter from its owner (one all_gather per parameter dtype). Waits for
  // the collectives (on CUDA: the current stream waits, the host does not).
  void step();
  // Sets every parameter's gradient (not only the owned ones') to absent or zero.
  void zero_grad(bool set_to_none = true);

  // This rank's optimizer, over its shard. Schedules drive its learning rate
  // (every rank's schedule the same way); its state is this rank's share.
  Optimizer& local_optimizer() { return *local_; }
  const Optimizer& local_optimizer() const { return *local_; }
  const distributed::ProcessGroup& process_group() const { return *group_; }

  int64_t num_groups() const { return static_cast<int64_t>(group_sizes_.size()); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  // The rank that owns parameter `index` (over all groups, in order).
  int rank_of(int64_t index) const;
  // The parameters (their indices over all groups) this rank owns, in order.
  const std::vector<int64_t>& owned_params() const { return local_to_global_; }

  // Collective. Gathers every rank's state on rank `to` for state_dict()
  // there (the other ranks only send). A later step() discards it.
  void consolidate_state_dict(int to = 0);
  // On the rank consolidate_state_dict gathered to, the full state, as a plain
  // optimizer over every parameter would save it (a copy). Throws kiln::Error
  // on any other rank, before consolidate_state_dict, or after a later step().
  StateDict state_dict() const;
  // Every rank passes the full state (state_dict() of any world size, or a
  // plain optimizer's over the same groups) and keeps the part of its shard.
  // Throws kiln::Error, changing nothing, when it does not fit.
  void load_state_dict(const StateDict& full);

 private:
  // Where a parameter's values travel in step()'s all_gather of its dtype.
  struct Placement {
    int owner = 0;
    int64_t offset = 0;  // elements into the owner's block
  };
  struct GatherPlan {
    DType dtype;
    int64_t block = 0;  // elements per rank (the largest owner's total)
    std::vector<int64_t> params;  // indices of the parameters of this dtype
  };

  std::shared_ptr<distributed::ProcessGroup> group_;
  std::vector<Tensor> params_;              // over all groups, in order
  std::vector<int64_t> group_sizes_;        // parameters per group
  std::vector<Placement> placement_;        // per parameter
  std::vector<int64_t> local_to_global_;    // this rank's optimizer's parameter i -> index
  std::vector<int64_t> global_to_local_;    // index -> local index, -1 when another rank owns it
  std::vector<GatherPlan> gathers_;         // per dtype present
  std::unique_ptr<Optimizer> local_;
  std::optional<StateDict> consolidated_;   // on rank `consolidated_to_` only
  int consolidated_to_ = -1;
};

}  // namespace kiln::optim
