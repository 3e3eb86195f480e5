// ZeroRedundancyOptimizer: the partition, the step with its all-gather, and
// the full state gathered for checkpoints (see zero.h).
//
// Invariants: every rank computes the same partition from the same list of
// parameters (no communication), so each knows every parameter's owner and
// its place in the owner's block of an all_gather. A rank's optimizer numbers
// its parameters 0..k-1 (local); the full state numbers them as a plain
// optimizer over all of them would (global): load and consolidate translate.
#include "optim/zero.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <numeric>
#include <set>

#include "core/autograd.h"
#include "core/ops.h"
#include "kernels/error.h"

namespace kiln::optim {

namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";

std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

// "state.<index>.<rest>" -> (index text, rest); nullopt for other names.
std::optional<std::pair<std::string, std::string>> split_state_name(const std::string& name) {
  constexpr std::string_view prefix = "state.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  return std::make_pair(name.substr(prefix.size(), dot - prefix.size()), name.substr(dot + 1));
}

// A state key ("12") as an index in [0, count); throws naming `where`.
int64_t parse_index(const std::string& key, int64_t count, const std::string& where) {
  int64_t index = -1;
  const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), index);
  KILN_CHECK(error == std::errc() && end == key.data() + key.size() && std::to_string(index) == key && index >= 0 &&
                 index < count,
             where, ": state for parameter '", key, "' (expected an index in [0, ", count, "))");
  return index;
}

// One rank's share of the state, renumbered globally, as bytes to send:
// a JSON table {"state": {...}, "tensors": [[name, dtype, shape, offset, bytes]]} and the raw tensor bytes.
struct PackedShard {
  std::string table;
  std::vector<uint8_t> payload;
};

PackedShard pack_shard(const StateDict& local, const std::vector<int64_t>& local_to_global) {
  nlohmann::json state = nlohmann::json::object();
  const int64_t count = static_cast<int64_t>(local_to_global.size());
  for (const auto& [key, entry] : local.meta.at("state").items()) {
    state[std::to_string(local_to_global[parse_index(key, count, kName)])] = entry;
  }
  nlohmann::json tensors = nlohmann::json::array();
  PackedShard packed;
  for (const auto& [name, tensor] : local.tensors) {
    const auto split = split_state_name(name);
    if (!split) continue;  // group values and the step counter: the receiving rank's own are the same
    const std::string global_name =
        "state." + std::to_string(local_to_global[parse_index(split->first, count, kName)]) + "." + split->second;
    const Tensor host = tensor.detach().cpu().contiguous();
    const size_t offset = packed.payload.size();
    packed.payload.resize(offset + host.nbytes());
    if (host.nbytes() > 0) std::memcpy(packed.payload.data() + offset, host.data_ptr(), host.nbytes());
    tensors.push_back({global_name, static_cast<int>(host.dtype()), host.shape(), offset, host.nbytes()});
  }
  packed.table = nlohmann::json{{"state", state}, {"tensors", tensors}}.dump();
  return packed;
}

// Adds a packed shard's state to `full` (the receiving side of pack_shard).
void unpack_shard(const std::string& table_text, const uint8_t* payload, size_t payload_size, StateDict& full) {
  const nlohmann::json table = nlohmann::json::parse(table_text);
  for (const auto& [key, entry] : table.at("state").items()) full.meta["state"][key] = entry;
  for (const auto& row : table.at("tensors")) {
    const auto offset = row.at(3).get<size_t>(), bytes = row.at(4).get<size_t>();
    KILN_ASSERT(offset + bytes <= payload_size, "ZeroRedundancyOptimizer: a gathered shard is shorter than its table");
    Tensor tensor = empty(row.at(2).get<Shape>(), {.dtype = static_cast<DType>(row.at(1).get<int>())});
    KILN_ASSERT(tensor.nbytes() == bytes, "ZeroRedundancyOptimizer: a gathered tensor's size does not match its shape");
    if (bytes > 0) std::memcpy(tensor.data_ptr(), payload + offset, bytes);
    full.tensors[row.at(0).get<std::string>()] = tensor;
  }
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, const OptimizerFactory& make_optimizer,
                                                 std::shared_ptr<distributed::ProcessGroup> process_group)
    : ZeroRedundancyOptimizer(single_group(std::move(params)), make_optimizer, std::move(process_group)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ParamGroup> groups, const OptimizerFactory& make_optimizer,
                                                 std::shared_ptr<distributed::ProcessGroup> process_group)
    : group_(process_group ? std::move(process_group) : distributed::default_process_group()) {
  KILN_CHECK(group_ != nullptr, kName, ": no process group was given and there is no default one "
             "(call distributed::init_process_group first)");
  KILN_CHECK(make_optimizer != nullptr, kName, ": make_optimizer is empty");
  KILN_CHECK(!groups.empty(), kName, ": no parameter groups were given");
  const int world = group_->size(), rank = group_->rank();

  std::set<const TensorImpl*> seen;
  for (const ParamGroup& group : groups) {
    for (const Tensor& p : group.params) {
      const int64_t index = num_params();
      KILN_CHECK(p.defined(), kName, ": parameter ", index, " is undefined");
      KILN_CHECK(seen.insert(p.impl()).second, kName, ": parameter ", index, " appears more than once");
      KILN_CHECK(params_.empty() || p.device() == params_.front().device(), kName, ": parameter ", index, " is on ",
                 p.device(), " but parameter 0 is on ", params_.empty() ? p.device() : params_.front().device(),
                 " (one optimizer per device)");
      KILN_CHECK(p.is_contiguous(), kName, ": parameter ", index, " of shape ", shape_str(p.shape()),
                 " is not contiguous");
      params_.push_back(p);
    }
    group_sizes_.push_back(static_cast<int64_t>(group.params.size()));
  }
  KILN_CHECK(!params_.empty(), kName, ": got an empty parameter list");

  // torch's partition: within each group, largest first, to the least loaded rank (the lowest on a tie).
  placement_.resize(params_.size());
  std::vector<int64_t> bytes_owned(world, 0), params_owned(world, 0);
  int64_t first = 0;
  for (int64_t size : group_sizes_) {
    std::vector<int64_t> order(static_cast<size_t>(size));
    std::iota(order.begin(), order.end(), first);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return params_[a].nbytes() > params_[b].nbytes(); });
    for (int64_t index : order) {
      const int owner = static_cast<int>(std::min_element(bytes_owned.begin(), bytes_owned.end()) - bytes_owned.begin());
      placement_[index].owner = owner;
      bytes_owned[owner] += static_cast<int64_t>(params_[index].nbytes());
      ++params_owned[owner];
    }
    first += size;
  }
  for (int r = 0; r < world; ++r) {
    KILN_CHECK(params_owned[r] > 0, kName, ": ", num_params(), " parameter(s) cannot be shared by ", world,
               " ranks: rank ", r, " would own none (every rank needs at least one)");
  }

  // Each dtype's all_gather: the owners' blocks, parameters in order within each.
  for (int64_t index = 0; index < num_params(); ++index) {
    const DType dtype = params_[index].dtype();
    auto plan = std::find_if(gathers_.begin(), gathers_.end(), [&](const GatherPlan& p) { return p.dtype == dtype; });
    if (plan == gathers_.end()) plan = gathers_.insert(gathers_.end(), GatherPlan{dtype});
    plan->params.push_back(index);
  }
  for (GatherPlan& plan : gathers_) {
    std::vector<int64_t> filled(world, 0);
    for (int64_t index : plan.params) {
      Placement& place = placement_[index];
      place.offset = filled[place.owner];
      filled[place.owner] += params_[index].numel();
    }
    plan.block = *std::max_element(filled.begin(), filled.end());
  }

  // This rank's optimizer: the same groups and hyperparameters, its parameters only.
  std::vector<ParamGroup> local_groups;
  global_to_local_.assign(params_.size(), -1);
  first = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup local = groups[g];
    local.params.clear();
    for (int64_t index = first; index < first + group_sizes_[g]; ++index) {
      if (placement_[index].owner != rank) continue;
      global_to_local_[index] = static_cast<int64_t>(local_to_global_.size());
      local_to_global_.push_back(index);
      local.params.push_back(params_[index]);
    }
    local_groups.push_back(std::move(local));
    first += group_sizes_[g];
  }
  local_ = make_optimizer(local_groups);
  KILN_CHECK(local_ != nullptr, kName, ": make_optimizer returned no optimizer");
  KILN_CHECK(local_->num_groups() == num_groups(), kName, ": make_optimizer returned an optimizer with ",
             local_->num_groups(), " parameter groups, expected the ", num_groups(), " it was given");
  for (int64_t g = 0; g < num_groups(); ++g) {
    const std::vector<Tensor>& got = local_->params(g);
    bool same = got.size() == local_groups[g].params.size();
    for (size_t i = 0; same && i < got.size(); ++i) same = got[i].impl() == local_groups[g].params[i].impl();
    KILN_CHECK(same, kName, ": make_optimizer returned an optimizer whose group ", g,
               " holds other parameters than the ones it was given (build it over exactly those)");
  }
}

int ZeroRedundancyOptimizer::rank_of(int64_t index) const {
  KILN_CHECK(index >= 0 && index < num_params(), kName, ": no parameter ", index, " (", num_params(), " parameters)");
  return placement_[index].owner;
}

void ZeroRedundancyOptimizer::step() {
  consolidated_.reset();
  local_->step();
  const int world = group_->size(), rank = group_->rank();
  if (world == 1) return;
  NoGradGuard no_grad;
  const Device device = params_.front().device();
  for (const GatherPlan& plan : gathers_) {
    if (plan.block == 0) continue;
    const TensorOptions options{.dtype = plan.dtype, .device = device};
    Tensor block = empty({plan.block}, options);  // (block,): this rank's parameters, end to end
    for (int64_t index : plan.params) {
      const Placement& place = placement_[index];
      const int64_t n = params_[index].numel();
      if (place.owner == rank && n > 0) block.narrow(0, place.offset, n).copy_(params_[index].detach().view({n}));
    }
    Tensor gathered = empty({world * plan.block}, options);  // (world * block,): every rank's block
    group_->all_gather(gathered, block)->wait();
    for (int64_t index : plan.params) {
      const Placement& place = placement_[index];
      const int64_t n = params_[index].numel();
      if (place.owner == rank || n == 0) continue;
      params_[index].detach().view({n}).copy_(gathered.narrow(0, place.owner * plan.block + place.offset, n));
      params_[index].bump_version();
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  for (const Tensor& p : params_) p.zero_grad_(set_to_none);
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  const int world = group_->size(), rank = group_->rank();
  KILN_CHECK(to >= 0 && to < world, kName, ".consolidate_state_dict: rank ", to, " is not in [0, ", world, ")");
  consolidated_.reset();
  consolidated_to_ = to;
  const StateDict local = local_->state_dict();
  const PackedShard mine = pack_shard(local, local_to_global_);

  StateDict full;
  if (rank == to) {
    full.meta["optimizer"] = local.meta.at("optimizer");
    full.meta["defaults"] = local.meta.at("defaults");
    nlohmann::json groups = local.meta.at("param_groups");
    int64_t first = 0;
    for (int64_t g = 0; g < num_groups(); ++g) {
      std::vector<int64_t> indices(static_cast<size_t>(group_sizes_[g]));
      std::iota(indices.begin(), indices.end(), first);
      groups[g]["params"] = indices;
      first += group_sizes_[g];
    }
    full.meta["param_groups"] = groups;
    full.meta["state"] = nlohmann::json::object();
    for (const auto& [name, tensor] : local.tensors) {
      if (!split_state_name(name)) full.tensors[name] = tensor.detach().cpu().clone();
    }
    unpack_shard(mine.table, mine.payload.data(), mine.payload.size(), full);
  }
  // One rank's shard at a time (two broadcasts from it), so no rank holds more than one other shard.
  for (int source = 0; source < world; ++source) {
    if (source == to) continue;
    Tensor sizes = tensor(std::vector<int64_t>{static_cast<int64_t>(mine.table.size()),
                                               static_cast<int64_t>(mine.payload.size())}, {2});
    group_->broadcast(sizes, source)->wait();
    const int64_t table_size = sizes.data<int64_t>()[0], payload_size = sizes.data<int64_t>()[1];
    Tensor bytes = empty({table_size + payload_size}, {.dtype = DType::u8});  // (table + payload,)
    if (rank == source) {
      std::memcpy(bytes.data_ptr(), mine.table.data(), mine.table.size());
      if (!mine.payload.empty()) std::memcpy(bytes.data<uint8_t>() + table_size, mine.payload.data(), mine.payload.size());
    }
    group_->broadcast(bytes, source)->wait();
    if (rank != to) continue;
    const uint8_t* data = bytes.data<uint8_t>();
    unpack_shard(std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(table_size)), data + table_size,
                 static_cast<size_t>(payload_size), full);
  }
  if (rank == to) consolidated_ = std::move(full);
}

StateDict ZeroRedundancyOptimizer::state_dict() const {
  const int rank = group_->rank();
  KILN_CHECK(consolidated_to_ >= 0, kName, ".state_dict (rank ", rank, "): the state is sharded over the ranks; "
             "call consolidate_state_dict(to) on every rank first, then state_dict() on rank `to`");
  KILN_CHECK(rank == consolidated_to_, kName, ".state_dict (rank ", rank, "): the full state was consolidated on rank ",
             consolidated_to_, ", not this one");
  KILN_CHECK(consolidated_.has_value(), kName, ".state_dict (rank ", rank, "): step() ran after "
             "consolidate_state_dict; consolidate again");
  return *consolidated_;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& full) {
  const std::string where = std::string(kName) + ".load_state_dict (rank " + std::to_string(group_->rank()) + ")";
  StateDict local;
  try {
    const nlohmann::json& meta = full.meta;
    KILN_CHECK(meta.is_object() && meta.contains("optimizer") && meta.contains("param_groups") &&
                   meta.contains("state"),
               where, ": not an optimizer state (it needs \"optimizer\", \"param_groups\" and \"state\")");
    const nlohmann::json& groups = meta.at("param_groups");
    KILN_CHECK(groups.is_array() && static_cast<int64_t>(groups.size()) == num_groups(), where, ": the state has ",
               groups.is_array() ? std::to_string(groups.size()) : "no list of", " parameter groups, this optimizer ",
               num_groups());
    local.meta["optimizer"] = meta.at("optimizer");
    if (meta.contains("defaults")) local.meta["defaults"] = meta.at("defaults");
    nlohmann::json local_groups = nlohmann::json::array();
    int64_t first = 0;
    for (int64_t g = 0; g < num_groups(); ++g) {
      const nlohmann::json& indices = groups.at(g).at("params");
      KILN_CHECK(indices.is_array() && static_cast<int64_t>(indices.size()) == group_sizes_[g], where, ": group ", g,
                 " of the state has ", indices.is_array() ? std::to_string(indices.size()) : "no list of",
                 " parameters, this optimizer's ", group_sizes_[g]);
      nlohmann::json local_group = groups.at(g);
      std::vector<int64_t> owned;
      for (int64_t index = first; index < first + group_sizes_[g]; ++index) {
        if (global_to_local_[index] >= 0) owned.push_back(global_to_local_[index]);
      }
      local_group["params"] = owned;
      local_groups.push_back(local_group);
      first += group_sizes_[g];
    }
    local.meta["param_groups"] = local_groups;
    local.meta["state"] = nlohmann::json::object();
    for (const auto& [key, entry] : meta.at("state").items()) {
      const int64_t local_index = global_to_local_[parse_index(key, num_params(), where)];
      if (local_index >= 0) local.meta["state"][std::to_string(local_index)] = entry;
    }
    for (const auto& [name, tensor] : full.tensors) {
      const auto split = split_state_name(name);
      if (!split) {
        local.tensors[name] = tensor;  // group values and the step counter
        continue;
      }
      const int64_t local_index = global_to_local_[parse_index(split->first, num_params(), where)];
      if (local_index >= 0) local.tensors["state." + std::to_string(local_index) + "." + split->second] = tensor;
    }
  } catch (const nlohmann::json::exception& error) {
    KILN_THROW(where, ": malformed state: ", error.what());
  }
  try {
    local_->load_state_dict(local);  // checks everything before it changes anything
  } catch (const Error& error) {
    KILN_THROW(where, ": ", error.message());
  }
  consolidated_.reset();
}

}  // namespace kiln::optim
