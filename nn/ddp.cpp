// DistributedDataParallel: buckets, hooks and the per-step state machine.
//
// Invariants of a step (between two finish_gradient_sync calls):
//   - used[i]: parameter i's hook fired (in any micro-batch, synced or not);
//   - ready[i]: its gradient was copied into its bucket (only with sync on);
//   - a bucket is launched when all its parameters are ready, and only after
//     every bucket of a lower index was launched (the same order on every rank).
#include "nn/ddp.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/error.h"

namespace kiln::nn {

using distributed::ProcessGroup;
using distributed::ReduceOp;
using distributed::WorkHandle;

namespace {

// Broadcasts `tensors` from `root`, coalesced into flat buffers of at most
// 256 MiB per dtype and device. Waits (CPU) or orders the current stream (CUDA).
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root) {
  NoGradGuard no_grad;
  constexpr size_t kChunkBytes = size_t{256} << 20;
  std::map<std::pair<int, int>, std::vector<Tensor>> by_kind;  // (dtype, device) -> tensors
  for (const Tensor& t : tensors) {
    const int device = t.is_cpu() ? -1 : t.device().index;
    by_kind[{static_cast<int>(t.dtype()), device}].push_back(t);
  }
  for (auto& [kind, list] : by_kind) {
    size_t begin = 0;
    while (begin < list.size()) {
      size_t end = begin, bytes = 0;
      int64_t numel = 0;
      while (end < list.size() && (end == begin || bytes + list[end].nbytes() <= kChunkBytes)) {
        bytes += list[end].nbytes();
        numel += list[end].numel();
        ++end;
      }
      Tensor flat = empty({numel}, TensorOptions{.dtype = list[begin].dtype(), .device = list[begin].device()});
      int64_t offset = 0;
      for (size_t i = begin; i < end; ++i) {
        flat.narrow(0, offset, list[i].numel()).view(list[i].shape()).copy_(list[i].detach());
        offset += list[i].numel();
      }
      group.broadcast(flat, root)->wait();
      if (group.rank() != root) {
        offset = 0;
        for (size_t i = begin; i < end; ++i) {
          list[i].detach().copy_(flat.narrow(0, offset, list[i].numel()).view(list[i].shape()));
          offset += list[i].numel();
        }
      }
      begin = end;
    }
  }
}

// Fails on every rank when the ranks' parameter lists differ (count,
// elements, or a hash of names, shapes and dtypes).
void verify_same_parameters(ProcessGroup& group, const NamedTensors& params) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const std::string& text) {
    for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  };
  int64_t numel = 0;
  for (const auto& [name, p] : params) {
    mix(name);
    mix(shape_str(p.shape()));
    mix(std::string(dtype_name(p.dtype())));
    numel += p.numel();
  }
  const std::vector<int64_t> mine = {static_cast<int64_t>(params.size()), numel, static_cast<int64_t>(hash >> 1)};
  Tensor local = tensor(mine, {3});
  Tensor all = zeros({3 * static_cast<int64_t>(group.size())}, {.dtype = DType::i64});
  group.all_gather(all, local)->wait();
  const int64_t* v = all.data<int64_t>();
  for (int r = 0; r < group.size(); ++r) {
    KILN_CHECK(v[3 * r] == v[0] && v[3 * r + 1] == v[1] && v[3 * r + 2] == v[2],
               "DistributedDataParallel: the ranks' models differ: rank 0 has ", v[0], " parameters (", v[1],
               " elements), rank ", r, " has ", v[3 * r], " parameters (", v[3 * r + 1],
               " elements)", v[3 * r + 2] != v[2] ? " or other names, shapes or dtypes" : "",
               "; every rank must build the same model");
  }
}

}  // namespace

// ---------------------------------------------------------------- reducer

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;   // indices into Reducer::params
    std::vector<int64_t> offsets;  // element offsets into flat
    Tensor flat;                   // (numel,) contiguous, the params' dtype and device
    size_t pending = 0;            // params not ready yet this step
    WorkHandle work;
  };

  std::shared_ptr<ProcessGroup> group;
  bool find_unused = false;
  std::vector<Tensor> params;  // trainable, in registration order
  std::vector<std::string> names;
  std::vector<size_t> bucket_of, position;  // parameter -> bucket, index within it
  std::vector<Bucket> buckets;
  std::vector<char> used, ready;
  size_t next_bucket = 0;
  bool sync = true;
  bool synced_backward = false;  // a hook fired with sync on this step

  void build_buckets(size_t cap_bytes) {
    // Reverse registration order; one open bucket per (dtype, device).
    std::map<std::pair<int, int>, size_t> open;
    for (size_t k = params.size(); k-- > 0;) {
      const Tensor& p = params[k];
      const std::pair<int, int> kind{static_cast<int>(p.dtype()), p.is_cpu() ? -1 : p.device().index};
      auto it = open.find(kind);
      if (it != open.end()) {
        Bucket& b = buckets[it->second];
        const size_t bytes = static_cast<size_t>(b.offsets.back() + params[b.params.back()].numel()) * p.element_size();
        if (bytes + p.nbytes() > cap_bytes) {
          open.erase(it);
          it = open.end();
        }
      }
      if (it == open.end()) {
        buckets.emplace_back();
        it = open.emplace(kind, buckets.size() - 1).first;
      }
      Bucket& b = buckets[it->second];
      b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params[b.params.back()].numel());
      position[k] = b.params.size();
      b.params.push_back(k);
      bucket_of[k] = it->second;
    }
    for (Bucket& b : buckets) {
      const Tensor& first = params[b.params.front()];
      const int64_t numel = b.offsets.back() + params[b.params.back()].numel();
      b.flat = zeros({numel}, TensorOptions{.dtype = first.dtype(), .device = first.device()});
      b.pending = b.params.size();
    }
  }

  Tensor slot(size_t index) const {
    const Bucket& b = buckets[bucket_of[index]];
    return b.flat.narrow(0, b.offsets[position[index]], params[index].numel()).view(params[index].shape());
  }

  // The post-accumulate-grad hook of parameter `index`.
  void on_grad(size_t index) {
    used[index] = 1;
    if (!sync) return;
    KILN_CHECK(!ready[index], "DistributedDataParallel: parameter '", names[index],
               "' received its gradient twice in one step (two backward passes without finish_gradient_sync(); "
               "use no_sync() for all but the last micro-batch)");
    synced_backward = true;
    mark_ready(index, /*zero=*/false);
  }

  void mark_ready(size_t index, bool zero) {
    NoGradGuard no_grad;
    Tensor destination = slot(index);
    if (zero) {
      destination.zero_();
    } else {
      destination.copy_(params[index].grad());
    }
    ready[index] = 1;
    Bucket& b = buckets[bucket_of[index]];
    if (--b.pending == 0) launch_ready_buckets();
  }

  void launch_ready_buckets() {
    while (next_bucket < buckets.size() && buckets[next_bucket].pending == 0) {
      Bucket& b = buckets[next_bucket++];
      b.work = group->all_reduce(b.flat, ReduceOp::avg);
    }
  }

  void reset() {
    std::fill(used.begin(), used.end(), 0);
    std::fill(ready.begin(), ready.end(), 0);
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.work.reset();
    }
    next_bucket = 0;
    synced_backward = false;
  }

  void finish() {
    KILN_CHECK(sync, "DistributedDataParallel::finish_gradient_sync: called inside no_sync(); gradients are "
               "synchronized after the backward of the last micro-batch, outside no_sync()");
    // Parameters not ready: accumulated in no_sync micro-batches only, or unused.
    std::vector<char> locally_used(params.size(), 0);
    std::vector<std::string> missing;
    for (size_t i = 0; i < params.size(); ++i) {
      locally_used[i] = used[i];
      if (ready[i]) continue;
      if (used[i] && params[i].grad().defined()) {
        mark_ready(i, false);
      } else if (find_unused) {
        locally_used[i] = 0;
        mark_ready(i, true);
      } else {
        missing.push_back(names[i]);
      }
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 10; ++i) list += (i ? ", '" : "'") + missing[i] + "'";
      if (missing.size() > 10) list += " and " + std::to_string(missing.size() - 10) + " more";
      // The buckets already launched write their flat buffers until they finish: the next
      // step's gradient copies into them must come after (a stream wait for NCCL).
      for (Bucket& b : buckets) {
        if (!b.work) continue;
        try {
          b.work->wait();
        } catch (...) {  // the error below says what went wrong; a broken group says so at its next use
        }
      }
      reset();
      KILN_THROW("DistributedDataParallel: ", missing.size(), " parameter(s) received no gradient in this step: ",
                 list, ". Every trainable parameter must take part in the loss on every rank, or pass "
                 "find_unused_parameters = true (DDPOptions)");
    }
    KILN_ASSERT(next_bucket == buckets.size(), "DDP launched ", next_bucket, " of ", buckets.size(), " buckets");
    // Which parameters some rank used (one small CPU all-reduce).
    std::vector<int32_t> global_used(params.size(), 1);
    if (find_unused && !params.empty()) {
      std::vector<int32_t> mine(locally_used.begin(), locally_used.end());
      Tensor map = tensor(mine, {static_cast<int64_t>(mine.size())});
      group->all_reduce(map, ReduceOp::max)->wait();
      const int32_t* m = map.data<int32_t>();
      global_used.assign(m, m + params.size());
    }
    for (Bucket& b : buckets) b.work->wait();
    NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!global_used[i]) continue;  // no rank used it: .grad stays as it was
      Tensor averaged = slot(i);
      Tensor grad = params[i].grad();
      if (grad.defined()) {
        grad.copy_(averaged);
      } else {
        params[i].set_grad(averaged.clone());
      }
    }
    reset();
  }
};

// ---------------------------------------------------------------- wrapper

DistributedDataParallel::DistributedDataParallel(ModulePtr module, std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : group_(std::move(group)) {
  setup(std::move(module), options);
}

DistributedDataParallel::DistributedDataParallel(Module& module, std::shared_ptr<ProcessGroup> group,
                                                 DDPOptions options)
    : group_(std::move(group)) {
  // A non-owning handle (aliasing constructor with an empty owner).
  setup(ModulePtr(ModulePtr(), &module), options);
}

DistributedDataParallel::~DistributedDataParallel() = default;

void DistributedDataParallel::setup(ModulePtr module, DDPOptions options) {
  KILN_CHECK(module != nullptr, "DistributedDataParallel: the module is null");
  KILN_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null (call "
             "distributed::init_process_group() first)");
  KILN_CHECK(options.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be positive, got ",
             options.bucket_cap_mb);
  module_ = std::move(module);
  options_ = options;
  register_module("module", module_);

  NamedTensors all_params = module_->named_parameters();
  verify_same_parameters(*group_, all_params);

  reducer_ = std::make_shared<Reducer>();
  Reducer& r = *reducer_;
  r.group = group_;
  r.find_unused = options.find_unused_parameters;
  std::unordered_set<const TensorImpl*> seen;
  std::vector<Tensor> state;
  std::optional<Device> device;
  for (const auto& [name, p] : all_params) {
    if (!seen.insert(p.impl()).second) continue;  // shared (tied) parameters count once
    state.push_back(p);
    if (!p.requires_grad()) continue;
    KILN_CHECK(!device || *device == p.device(), "DistributedDataParallel: parameters on several devices (",
               device->str(), " and ", p.device().str(), " for '", name, "'); one device per process");
    device = p.device();
    r.params.push_back(p);
    r.names.push_back(name);
  }
  // As torch: nothing to synchronize (every rank agrees: their parameters were verified above).
  KILN_CHECK(!r.params.empty(), "DistributedDataParallel: the module has no parameter that requires grad (",
             all_params.size(), " parameters, none trainable); DDP is not needed for it");
  for (const auto& [name, b] : module_->named_buffers()) state.push_back(b);
  broadcast_coalesced(*group_, state, 0);

  r.bucket_of.assign(r.params.size(), 0);
  r.position.assign(r.params.size(), 0);
  r.used.assign(r.params.size(), 0);
  r.ready.assign(r.params.size(), 0);
  r.build_buckets(static_cast<size_t>(options.bucket_cap_mb * 1024.0 * 1024.0));
  std::weak_ptr<Reducer> weak = reducer_;
  for (size_t i = 0; i < r.params.size(); ++i) {
    // The hook outlives this wrapper on the parameter: it does nothing once the wrapper is gone.
    r.params[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_grad(i);
    });
  }
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (options_.broadcast_buffers && is_training() && group_->size() > 1) sync_buffers();
  return module_->forward(input);
}

void DistributedDataParallel::sync_buffers() {
  std::vector<Tensor> buffers;
  for (const auto& [name, b] : module_->named_buffers()) buffers.push_back(b);
  if (!buffers.empty()) broadcast_coalesced(*group_, buffers, 0);
}

void DistributedDataParallel::finish_gradient_sync() { reducer_->finish(); }

bool DistributedDataParallel::gradient_sync_pending() const { return reducer_->synced_backward; }

DistributedDataParallel::NoSyncGuard DistributedDataParallel::no_sync() {
  const bool previous = reducer_->sync;
  reducer_->sync = false;
  return NoSyncGuard(this, previous);
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : ddp_(other.ddp_), previous_(other.previous_) {
  other.ddp_ = nullptr;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() {
  if (ddp_) ddp_->reducer_->sync = previous_;
}

void DistributedDataParallel::set_require_backward_grad_sync(bool sync) { reducer_->sync = sync; }

bool DistributedDataParallel::require_backward_grad_sync() const { return reducer_->sync; }

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_parameter_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : reducer_->buckets) {
    out.emplace_back();
    for (size_t index : b.params) out.back().push_back(reducer_->names[index]);
  }
  return out;
}

// ---------------------------------------------------------------- SyncBatchNorm

Tensor all_reduce_sum_with_grad(const Tensor& x, const std::shared_ptr<ProcessGroup>& group) {
  Tensor out = x.detach().contiguous().clone();
  group->all_reduce(out, ReduceOp::sum)->wait();
  if (autograd::any_requires_grad({&x})) {
    autograd::record("all_reduce", {x}, {out}, [group](const autograd::TensorList& grads) -> autograd::TensorList {
      Tensor summed = grads[0].contiguous().clone();
      group->all_reduce(summed, ReduceOp::sum)->wait();
      return {summed};
    });
  }
  return out;
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group, double eps,
                             std::optional<double> momentum, bool affine, bool track_running_stats, int spatial_dims)
    : BatchNorm(num_features, eps, momentum, affine, track_running_stats, spatial_dims), group_(std::move(group)) {
  KILN_CHECK(group_ != nullptr, "SyncBatchNorm: the process group is null");
}

Tensor SyncBatchNorm::forward(const Tensor& input) {
  if (!is_training() || group_->size() == 1) return BatchNorm::forward(input);
  KILN_CHECK(input.dim() >= 2 && input.size(1) == num_features, "SyncBatchNorm: expected an input of shape (N, ",
             num_features, ", ...), got ", shape_str(input.shape()));
  std::vector<int64_t> dims = {0};
  Shape channel_shape(input.dim(), 1);  // (1, C, 1, ...)
  channel_shape[1] = num_features;
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  const TensorOptions options{.dtype = input.dtype(), .device = input.device()};
  // Global count and mean, then the global sum of squared deviations from it.
  const double local_count = static_cast<double>(input.numel() / num_features);
  Tensor sums = all_reduce_sum_with_grad(cat({sum(input, dims), full({1}, local_count, options)}), group_);
  Tensor count = sums.narrow(0, num_features, 1).detach();  // (1)
  Tensor mean = sums.narrow(0, 0, num_features) / count;    // (C)
  Tensor centered = input - mean.view(channel_shape);
  Tensor squares = all_reduce_sum_with_grad(sum(centered * centered, dims), group_);
  Tensor var = squares / count;  // biased, for normalizing
  Tensor out = centered * rsqrt(var + eps).view(channel_shape);
  if (weight.defined()) out = out * weight.view(channel_shape) + bias.view(channel_shape);
  if (running_mean.defined()) {
    NoGradGuard no_grad;
    num_batches_tracked.add_(ones({}, {.dtype = DType::i64, .device = num_batches_tracked.device()}));
    const double factor =
        momentum ? *momentum : 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
    // torch keeps the unbiased variance: squares / (count - 1).
    Tensor unbiased = squares.detach() / (count - 1.0);
    running_mean.mul_(1.0 - factor).add_(mean.detach().to(running_mean.dtype()), factor);
    running_var.mul_(1.0 - factor).add_(unbiased.to(running_var.dtype()), factor);
  }
  return out;
}

}  // namespace kiln::nn
