// DistributedDataParallel: data-parallel training over a ProcessGroup, after
// torch.nn.parallel.DistributedDataParallel.
//
// Construction (collective) checks that every rank has the same parameters,
// broadcasts rank 0's parameters and buffers, and groups the gradients of the
// trainable parameters into buckets (bucket_cap_mb, in reverse order of
// registration: roughly the order backward produces them; one dtype and
// device per bucket). A post-accumulate-grad hook on each parameter copies its
// gradient into its bucket; when a bucket is complete its all-reduce (avg) is
// started asynchronously, buckets strictly in index order so that every rank
// issues the same collectives in the same order. Communication thus overlaps
// the rest of the backward pass. finish_gradient_sync() waits for the
// all-reduces and writes the averaged gradients back to .grad: call it after
// the last backward of a step, before clipping and the optimizer step.
//
// Per step (what a trainer's "ddp" strategy does):
//   for each micro-batch but the last:  { auto guard = ddp.no_sync(); loss.backward(); }
//   last micro-batch:                    loss.backward();
//   ddp.finish_gradient_sync();          // .grad now holds the average over ranks
//   clip, optimizer.step(), zero_grad
// Every rank must take the same number of steps and micro-batches.
//
// Gradients are copied into flat bucket buffers (not aliased), so .grad stays
// an ordinary tensor that set_to_none zero_grad may drop.
#pragma once

#include <memory>
#include <string>

#include "core/distributed/process_group.h"
#include "nn/conv.h"
#include "nn/module.h"

namespace kiln::nn {

struct DDPOptions {
  double bucket_cap_mb = 25;            // MiB per gradient bucket
  bool find_unused_parameters = false;  // allow parameters without a gradient in a step
  bool broadcast_buffers = true;        // forward() in training mode first broadcasts rank 0's buffers
};

class DistributedDataParallel : public Module {
 public:
  // Collective. `module` must already be on its device and dtype (moving it
  // later leaves the buckets behind); all its parameters on one device.
  // Throws kiln::Error when ranks have different parameters.
  DistributedDataParallel(ModulePtr module, std::shared_ptr<distributed::ProcessGroup> group,
                          DDPOptions options = {});
  // Non-owning: `module` must outlive the wrapper (a Trainer wraps TrainModule::model()).
  DistributedDataParallel(Module& module, std::shared_ptr<distributed::ProcessGroup> group,
                          DDPOptions options = {});
  ~DistributedDataParallel() override;

  // Broadcasts the buffers (training mode, broadcast_buffers) and runs the module.
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "DistributedDataParallel"; }
  Module& module() const { return *module_; }
  distributed::ProcessGroup& process_group() const { return *group_; }
  const DDPOptions& options() const { return options_; }

  // Waits for the gradient all-reduces of this step and writes the averaged
  // gradients into .grad. A parameter that got no gradient since the last
  // call (in any micro-batch) throws kiln::Error naming it, unless
  // find_unused_parameters: then it counts as a zero gradient, and one that no
  // rank used keeps .grad as it was. CPU: blocks until the all-reduces are
  // done; CUDA: orders the current stream after them without a host wait
  // (find_unused_parameters adds one small host-side all-reduce).
  void finish_gradient_sync();
  // Whether a backward with gradient sync ran since the last finish_gradient_sync().
  bool gradient_sync_pending() const;

  // Gradient synchronization off for the guard's lifetime: gradients only
  // accumulate locally (torch's no_sync), e.g. for all micro-batches of an
  // accumulation but the last.
  class NoSyncGuard {
   public:
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    friend class DistributedDataParallel;
    NoSyncGuard(DistributedDataParallel* ddp, bool previous) : ddp_(ddp), previous_(previous) {}
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync();
  // The flag no_sync() toggles (Lightning's require_backward_grad_sync).
  void set_require_backward_grad_sync(bool sync);
  bool require_backward_grad_sync() const;

  // Broadcasts rank 0's buffers (BatchNorm running statistics) to every rank. Collective.
  void sync_buffers();
  // Number of gradient buckets and the trainable parameters of each (for tests).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;

  struct Reducer;

 private:
  void setup(ModulePtr module, DDPOptions options);

  ModulePtr module_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;  // the parameter hooks hold weak references
};

// BatchNorm whose training statistics are those of the global batch (every
// rank of `group`), after torch.nn.SyncBatchNorm: per channel, the sums and
// counts are all-reduced (two small collectives: the mean, then the squared
// deviations from it, which is numerically stable), and the backward
// all-reduces their gradients in turn. Same parameters, buffers and
// state_dict names as BatchNorm; in eval mode, or with one rank, it is
// BatchNorm. Every rank must run it in the same order (it communicates).
class SyncBatchNorm : public BatchNorm {
 public:
  SyncBatchNorm(int64_t num_features, std::shared_ptr<distributed::ProcessGroup> group, double eps = 1e-5,
                std::optional<double> momentum = 0.1, bool affine = true, bool track_running_stats = true,
                int spatial_dims = 2);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "SyncBatchNorm"; }

 private:
  std::shared_ptr<distributed::ProcessGroup> group_;
};

// sum over the ranks of `group`, differentiable: the gradient of each rank's
// input is the sum over the ranks of the output gradients. Blocks until done (CPU).
Tensor all_reduce_sum_with_grad(const Tensor& x, const std::shared_ptr<distributed::ProcessGroup>& group);

}  // namespace kiln::nn
