#include "trainer/strategy.h"

#include <cstdlib>

#include "core/ops.h"
#include "kernels/error.h"

namespace kiln {

using distributed::ReduceOp;

Strategy::Strategy(const std::string& strategy, int devices, int num_nodes) {
  KILN_CHECK(strategy == "auto" || strategy == "ddp" || strategy == "ddp_find_unused_parameters_true",
             "Trainer: strategy must be \"auto\", \"ddp\" or \"ddp_find_unused_parameters_true\", got '", strategy,
             "'");
  KILN_CHECK(devices >= 1, "Trainer: devices must be >= 1, got ", devices);
  KILN_CHECK(num_nodes >= 1, "Trainer: num_nodes must be >= 1, got ", num_nodes);
  const int processes = devices * num_nodes;
  if (strategy == "auto" && processes == 1) {
    // Several copies of a single-device run would each train on everything.
    const char* world = std::getenv("WORLD_SIZE");
    KILN_CHECK(world == nullptr || std::string(world) == "1", "Trainer: the launcher started WORLD_SIZE=", world,
               " processes but devices=1; set devices (and strategy \"ddp\") to the processes per node");
    return;
  }
  name_ = "ddp";
  find_unused_parameters_ = strategy == "ddp_find_unused_parameters_true";
  if (!distributed::launched_distributed()) {
    // Lightning runs "ddp" on one device as a group of one: nothing to synchronize.
    KILN_CHECK(processes == 1, "Trainer: strategy \"ddp\" with devices=", devices, " and num_nodes=", num_nodes,
               " needs one process per device: start the program with `kiln-run --nproc-per-node ", devices,
               num_nodes > 1 ? " --nnodes " + std::to_string(num_nodes) + " ..." : std::string(),
               " -- <program> <args>` (WORLD_SIZE is not set)");
    return;
  }
  const distributed::DistributedEnv env = distributed::read_torchrun_env();
  KILN_CHECK(env.world_size == processes && env.local_world_size == devices, "Trainer: devices=", devices,
             " and num_nodes=", num_nodes, " ask for ", processes, " processes (", devices,
             " per node), but the launcher started WORLD_SIZE=", env.world_size,
             " (LOCAL_WORLD_SIZE=", env.local_world_size, "); make --nproc-per-node equal devices");
  global_rank_ = env.rank;
  local_rank_ = env.local_rank;
  world_size_ = env.world_size;
  launched_ = true;
}

void Strategy::setup_environment() {
  if (!distributed() || group_) return;
  group_ = distributed::default_process_group();
  if (!group_) group_ = distributed::init_process_group();
  KILN_CHECK(group_->size() == world_size_ && group_->rank() == global_rank_,
             "Trainer: the default process group has rank ", group_->rank(), " of ", group_->size(),
             " but the environment says rank ", global_rank_, " of ", world_size_);
}

void Strategy::wrap_model(nn::Module& model, bool find_unused_parameters) {
  ddp_.reset();
  if (!distributed()) return;
  nn::DDPOptions options;
  options.find_unused_parameters = find_unused_parameters || find_unused_parameters_;
  ddp_ = std::make_unique<nn::DistributedDataParallel>(model, group_, options);
}

std::vector<bool> Strategy::reduce_any(const std::vector<bool>& flags) {
  if (!distributed() || flags.empty()) return flags;
  std::vector<int32_t> values(flags.begin(), flags.end());
  Tensor reduced = tensor(values, {static_cast<int64_t>(values.size())});
  group_->all_reduce(reduced, ReduceOp::max)->wait();
  const int32_t* any = reduced.data<int32_t>();
  return std::vector<bool>(any, any + flags.size());
}

std::vector<double> Strategy::sum_over_ranks(const std::vector<std::string>& names, std::vector<double> values) {
  if (!distributed()) return values;
  // Same names on every rank: max over the ranks of (n, hash, -n, -hash) is (n, hash, -n, -hash) only then.
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the names
  for (const std::string& name : names) {
    for (unsigned char c : name + '\n') hash = (hash ^ c) * 1099511628211ull;
  }
  const auto count = static_cast<int64_t>(names.size());
  const auto key = static_cast<int64_t>(hash >> 2);
  Tensor check = tensor(std::vector<int64_t>{count, key, -count, -key}, {4});
  group_->all_reduce(check, ReduceOp::max)->wait();
  const int64_t* c = check.data<int64_t>();
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  KILN_CHECK(c[0] == count && c[1] == key && c[2] == -count && c[3] == -key, "Trainer (ddp): rank ", global_rank_,
             " logged the metrics [", listed, "] but another rank logged others; every rank must log the same "
             "names at the same points");
  if (values.empty()) return values;
  Tensor summed = tensor(values, {static_cast<int64_t>(values.size())});
  group_->all_reduce(summed, ReduceOp::sum)->wait();
  return summed.to_vector<double>();
}

std::string Strategy::broadcast_string(const std::string& text) {
  if (!distributed()) return text;
  Tensor length = tensor(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1});
  group_->broadcast(length, 0)->wait();
  const int64_t size = length.data<int64_t>()[0];
  std::vector<int32_t> bytes(static_cast<size_t>(size), 0);
  if (is_global_zero()) bytes.assign(text.begin(), text.end());
  if (size == 0) return "";
  Tensor payload = tensor(bytes, {size});
  group_->broadcast(payload, 0)->wait();
  const int32_t* received = payload.data<int32_t>();
  return std::string(received, received + size);
}

void Strategy::barrier() {
  if (distributed()) group_->barrier()->wait();
}

}  // namespace kiln
