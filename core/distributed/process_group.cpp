// ProcessGroup front end: argument checks, the choice of backend by device,
// torchrun's environment and the default group.
#include "core/distributed/process_group.h"

#include <atomic>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "kernels/error.h"

namespace kiln::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::chrono::milliseconds default_collective_timeout() {
  if (const char* text = std::getenv("KILN_DIST_TIMEOUT")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    KILN_CHECK(end != text && *end == '\0' && seconds > 0, "KILN_DIST_TIMEOUT: expected a positive number of seconds, got '",
               text, "'");
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  return std::chrono::minutes(30);
}

namespace {

// The local IPv4 address of the interface that routes to `host` (no packet is
// sent: connect() on a UDP socket only picks the route). Empty when unknown.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string result;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text))) {
      result = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return result;
}

void check_tensor(const Tensor& tensor, const char* op, const char* what) {
  KILN_CHECK(tensor.defined(), op, ": the ", what, "tensor is undefined");
  KILN_CHECK(tensor.is_contiguous(), op, ": the ", what, "tensor must be contiguous (shape ",
             shape_str(tensor.shape()), ", strides ", shape_str(tensor.strides()), "); call .contiguous() first");
}

void check_op(DType dtype, ReduceOp op, const char* name) {
  KILN_CHECK(op != ReduceOp::avg || is_floating(dtype), name, ": ReduceOp avg needs a floating dtype, got ",
             dtype_name(dtype));
}

}  // namespace

// ---------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(std::shared_ptr<TCPStore> store, int rank, int size, ProcessGroupOptions options,
                           std::string prefix)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)), prefix_(std::move(prefix)) {
  KILN_CHECK(store_ != nullptr, "ProcessGroup: the store is null");
  KILN_CHECK(size >= 1 && rank >= 0 && rank < size, "ProcessGroup: rank ", rank, " is not in [0, ", size, ")");
  KILN_CHECK(options_.timeout.count() > 0, "ProcessGroup: the timeout must be positive, got ",
             options_.timeout.count(), " ms");
  std::string hostname = options_.gloo_hostname;
  if (hostname.empty() && !std::getenv("GLOO_SOCKET_IFNAME")) {
    hostname = local_address_towards(store_->host());
    if (hostname.empty()) hostname = "127.0.0.1";
  }
  gloo_ = make_gloo_backend(*store_, prefix_ + "gloo/", rank_, size_, options_.timeout, hostname);
}

ProcessGroup::~ProcessGroup() = default;

Backend& ProcessGroup::backend_for(const Tensor& tensor) {
  if (tensor.is_cpu()) return *gloo_;
  std::lock_guard<std::mutex> lock(nccl_mutex_);
  const int device = tensor.device().index;
  if (nccl_.size() <= static_cast<size_t>(device)) nccl_.resize(device + 1);
  if (!nccl_[device]) {
    // Communicators are made in the same order on every rank (collectives
    // are issued in the same order), so a counter names each one's id key.
    int64_t made = 0;
    for (const auto& backend : nccl_) made += backend != nullptr;
    nccl_[device] = make_nccl_backend(*store_, prefix_ + "nccl/" + std::to_string(made) + "/", rank_, size_,
                                      device, options_.timeout);
  }
  return *nccl_[device];
}

WorkHandle ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "all_reduce", "");
  check_op(tensor.dtype(), op, "all_reduce");
  return backend_for(tensor).all_reduce(tensor, op);
}

WorkHandle ProcessGroup::broadcast(const Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "");
  KILN_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this group (size ", size_, ")");
  return backend_for(tensor).broadcast(tensor, root);
}

WorkHandle ProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  check_tensor(output, "all_gather", "output ");
  check_tensor(input, "all_gather", "input ");
  KILN_CHECK(output.device() == input.device() && output.dtype() == input.dtype(),
             "all_gather: output (", dtype_name(output.dtype()), ", ", output.device().str(), ") and input (",
             dtype_name(input.dtype()), ", ", input.device().str(), ") must have the same dtype and device");
  KILN_CHECK(output.numel() == input.numel() * size_, "all_gather: the output needs ", size_, " x ", input.numel(),
             " elements (input ", shape_str(input.shape()), "), got ", output.numel(), " (",
             shape_str(output.shape()), ")");
  return backend_for(input).all_gather(output, input);
}

WorkHandle ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor(output, "reduce_scatter", "output ");
  check_tensor(input, "reduce_scatter", "input ");
  check_op(input.dtype(), op, "reduce_scatter");
  KILN_CHECK(output.device() == input.device() && output.dtype() == input.dtype(),
             "reduce_scatter: output (", dtype_name(output.dtype()), ", ", output.device().str(), ") and input (",
             dtype_name(input.dtype()), ", ", input.device().str(), ") must have the same dtype and device");
  KILN_CHECK(input.numel() == output.numel() * size_, "reduce_scatter: the input needs ", size_, " x ",
             output.numel(), " elements (output ", shape_str(output.shape()), "), got ", input.numel(), " (",
             shape_str(input.shape()), ")");
  return backend_for(input).reduce_scatter(output, input, op);
}

WorkHandle ProcessGroup::barrier() { return gloo_->barrier(); }

// ---------------------------------------------------------------- environment

namespace {

const char* env_or_null(const char* name) {
  const char* value = std::getenv(name);
  return (value && *value) ? value : nullptr;
}

int env_int(const char* name, const int* fallback) {
  const char* text = env_or_null(name);
  if (!text) {
    KILN_CHECK(fallback != nullptr, "distributed: the environment variable ", name,
               " is not set (start the program with kiln-run or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK, "
               "MASTER_ADDR and MASTER_PORT)");
    return *fallback;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  KILN_CHECK(end != text && *end == '\0' && value >= 0 && value <= 1 << 30, "distributed: ", name,
             " must be a non-negative integer, got '", text, "'");
  return static_cast<int>(value);
}

std::mutex default_mutex;
std::shared_ptr<ProcessGroup> default_group;

}  // namespace

bool launched_distributed() { return env_or_null("WORLD_SIZE") != nullptr; }

RestartRound read_restart_round() {
  RestartRound round;
  const int zero = 0;
  round.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", &zero);
  if (const char* text = env_or_null("KILN_RUN_START_TIME")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    KILN_CHECK(end != text && *end == '\0' && seconds > 0, "distributed: KILN_RUN_START_TIME must be a positive "
               "number of seconds since the Unix epoch, got '", text, "'");
    round.run_start = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds)));
  }
  return round;
}

DistributedEnv read_torchrun_env() {
  DistributedEnv env;
  env.rank = env_int("RANK", nullptr);
  env.world_size = env_int("WORLD_SIZE", nullptr);
  KILN_CHECK(env.world_size >= 1 && env.rank < env.world_size, "distributed: RANK ", env.rank,
             " is not in [0, WORLD_SIZE=", env.world_size, ")");
  env.local_rank = env_int("LOCAL_RANK", &env.rank);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", &env.world_size);
  const char* addr = env_or_null("MASTER_ADDR");
  KILN_CHECK(addr != nullptr, "distributed: the environment variable MASTER_ADDR is not set (the address of rank 0, "
             "e.g. 127.0.0.1 on one machine)");
  env.master_addr = addr;
  env.master_port = env_int("MASTER_PORT", nullptr);
  KILN_CHECK(env.master_port > 0 && env.master_port < 65536, "distributed: MASTER_PORT ", env.master_port,
             " is not a port in [1, 65535]");
  const int zero = 0;
  env.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", &zero);
  if (const char* agent = env_or_null("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string value = agent;
    env.use_agent_store = value == "True" || value == "true" || value == "1";
  }
  return env;
}

std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  const DistributedEnv env = read_torchrun_env();
  const bool serve = env.rank == 0 && !env.use_agent_store;
  auto store = std::make_shared<TCPStore>(env.master_addr, env.master_port, serve, options.timeout);
  // Keys of each restart round apart, so a restarted job never reads a stale
  // key; and of each init in a process apart (every rank inits as often): the
  // launcher's store keeps a destroyed group's keys, its peers' old addresses.
  static std::atomic<int64_t> inits{0};
  const std::string prefix = "kiln/round" + std::to_string(env.restart_count) + "/init" +
                             std::to_string(inits.fetch_add(1)) + "/default/";
  auto group = std::make_shared<ProcessGroup>(store, env.rank, env.world_size, options, prefix);
  std::lock_guard<std::mutex> lock(default_mutex);
  default_group = group;
  return group;
}

std::shared_ptr<ProcessGroup> default_process_group() {
  std::lock_guard<std::mutex> lock(default_mutex);
  return default_group;
}

void destroy_process_group() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(default_mutex);
    group.swap(default_group);
  }
}

}  // namespace kiln::distributed
