// Process groups: collectives over the ranks of a job, after torch.distributed.
//
// One ProcessGroup serves both kinds of tensor: Gloo for CPU tensors
// (connected when the group is made) and NCCL for CUDA tensors (one
// communicator per device, made on the first CUDA collective, its unique id
// exchanged through the same store). Every collective is asynchronous and
// returns a Work handle:
//   - Gloo runs the collectives of a group one after another on a worker
//     thread, in the order they were issued; Work::wait() blocks the host.
//   - NCCL runs them on the group's own stream, which first waits (by event)
//     for the work already queued on the current stream; Work::wait() makes
//     the current stream wait for the collective and does not block the host.
// Every rank must issue the same collectives in the same order.
//
// Tensors are reduced in place and must be contiguous. Every collective has
// the group's timeout: a dead peer (closed connection) or a hung one (no
// progress before the deadline) becomes a kiln::Error on the survivors, never
// a hang. After a failure the group is broken: later calls throw at once.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "core/distributed/tcp_store.h"
#include "core/tensor.h"

namespace kiln::distributed {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// A pending collective.
class Work {
 public:
  virtual ~Work() = default;
  // CPU (Gloo): blocks until the collective finished. CUDA (NCCL): makes the
  // current stream wait for it, without blocking the host. Throws kiln::Error
  // when the collective failed or timed out. May be called more than once.
  virtual void wait() = 0;
  // Whether the collective finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

// The collectives of one backend (internal: ProcessGroup picks one by device).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual WorkHandle all_reduce(const Tensor& tensor, ReduceOp op) = 0;
  virtual WorkHandle broadcast(const Tensor& tensor, int root) = 0;
  virtual WorkHandle all_gather(const Tensor& output, const Tensor& input) = 0;
  virtual WorkHandle reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) = 0;
  virtual WorkHandle barrier() = 0;
};

// The default collective timeout: $KILN_DIST_TIMEOUT seconds when set, else
// 1800 s (PyTorch's: a rank may legitimately wait minutes for another one
// that writes a checkpoint or evaluates).
std::chrono::milliseconds default_collective_timeout();

struct ProcessGroupOptions {
  std::chrono::milliseconds timeout = default_collective_timeout();
  // The address Gloo listens on. Empty: $GLOO_SOCKET_IFNAME's interface when
  // set, else the local address that routes to the store's host (127.0.0.1
  // on one machine).
  std::string gloo_hostname;
};

class ProcessGroup {
 public:
  // Collective: every rank of the group calls it with the same store. Keys
  // go under `prefix` (so that several groups, or restarts, share a store).
  // Connects Gloo now (throws kiln::Error after the timeout when a rank does
  // not arrive); NCCL connects on the first CUDA collective.
  ProcessGroup(std::shared_ptr<TCPStore> store, int rank, int size, ProcessGroupOptions options = {},
               std::string prefix = "");
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ProcessGroupOptions& options() const { return options_; }
  TCPStore& store() { return *store_; }

  // In place: every rank ends with the reduction over all ranks. avg needs a
  // floating dtype.
  WorkHandle all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum);
  // In place: every rank ends with `root`'s values.
  WorkHandle broadcast(const Tensor& tensor, int root = 0);
  // output (size * input.numel() elements, rank-major) receives every rank's input.
  WorkHandle all_gather(const Tensor& output, const Tensor& input);
  // output (input.numel() / size elements) receives this rank's slice of the
  // reduction of every rank's input.
  WorkHandle reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum);
  // Returns when every rank arrived (through Gloo).
  WorkHandle barrier();

 private:
  Backend& backend_for(const Tensor& tensor);

  std::shared_ptr<TCPStore> store_;
  int rank_, size_;
  ProcessGroupOptions options_;
  std::string prefix_;
  std::unique_ptr<Backend> gloo_;
  std::mutex nccl_mutex_;
  std::vector<std::unique_ptr<Backend>> nccl_;  // per CUDA device, made on first use
};

// --- torchrun's environment
struct DistributedEnv {
  int rank = 0;               // RANK
  int world_size = 1;         // WORLD_SIZE
  int local_rank = 0;         // LOCAL_RANK (default: RANK)
  int local_world_size = 1;   // LOCAL_WORLD_SIZE (default: WORLD_SIZE)
  std::string master_addr;    // MASTER_ADDR
  int master_port = 0;        // MASTER_PORT
  int restart_count = 0;      // TORCHELASTIC_RESTART_COUNT (kiln-run sets it)
  bool use_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE: the launcher hosts the store
};
// Whether the process was started by a launcher (WORLD_SIZE is set).
bool launched_distributed();

// What a launcher tells the workers it restarted: the restart round
// (TORCHELASTIC_RESTART_COUNT; 0 when unset) and when the launcher started the
// run's first round (KILN_RUN_START_TIME, seconds since the Unix epoch, which
// kiln-run sets; nullopt when unset). Throws kiln::Error naming a malformed one.
struct RestartRound {
  int restart_count = 0;
  std::optional<std::chrono::system_clock::time_point> run_start;
};
RestartRound read_restart_round();
// Reads the variables; throws kiln::Error naming a missing or malformed one.
DistributedEnv read_torchrun_env();

// Connects to (rank 0 or the launcher: serves) the store at
// MASTER_ADDR:MASTER_PORT and makes the default group from the environment.
// Collective. Throws kiln::Error when a rank does not arrive within the timeout.
std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});
// The group made by init_process_group (null before, or after destroy).
std::shared_ptr<ProcessGroup> default_process_group();
void destroy_process_group();

// --- backend factories (internal; the NCCL one throws when CUDA is off)
std::unique_ptr<Backend> make_gloo_backend(TCPStore& store, const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout, const std::string& hostname);
std::unique_ptr<Backend> make_nccl_backend(TCPStore& store, const std::string& prefix, int rank, int size,
                                           int device, std::chrono::milliseconds timeout);

}  // namespace kiln::distributed
