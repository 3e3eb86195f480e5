// The NCCL backend (CUDA tensors of one device). Collectives run on the
// backend's own stream: it first waits (event) for the work queued on the
// caller's current stream, and each collective records a "done" event that
// Work::wait() makes the current stream wait for, so the host never blocks
// and communication overlaps the computation queued after it.
//
// A watchdog thread polls the pending collectives: one still running after
// the timeout, or an asynchronous NCCL error (a peer died), aborts the
// communicator (its kernels then exit, so the streams drain) and marks the
// backend broken; every later call and Work::wait() throws kiln::Error.
#include <condition_variable>
#include <deque>
#include <optional>
#include <thread>

#include "core/distributed/process_group.h"
#include "kernels/cuda/runtime.h"
#include "kernels/error.h"
#include "kernels/nccl.h"

namespace kiln::distributed {

namespace {

namespace nccl = kernels::nccl;
using Clock = std::chrono::steady_clock;

nccl::RedOp to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return nccl::RedOp::sum;
    case ReduceOp::avg: return nccl::RedOp::avg;
    case ReduceOp::max: return nccl::RedOp::max;
    case ReduceOp::min: return nccl::RedOp::min;
  }
  KILN_THROW("nccl: unknown reduction");
}

// State shared by the backend, its works and the watchdog.
struct NcclState {
  std::mutex mutex;
  std::string error;  // non-empty once broken
  std::string where;  // "NCCL, rank r of n, cuda:d"
  void throw_if_broken(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    KILN_CHECK(error.empty(), what, " (", where, "): the process group is unusable after an earlier failure: ", error);
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::string description, int device, std::vector<Tensor> keep_alive)
      : state_(std::move(state)), description_(std::move(description)), device_(device),
        done_(cuda::create_event(device, /*timing=*/false)), keep_alive_(std::move(keep_alive)), started_(Clock::now()) {}
  ~NcclWork() override {
    try {
      cuda::destroy_event(done_);
    } catch (...) {  // after a sticky CUDA error, or at exit: never throw from a destructor
    }
  }

  void wait() override {
    state_->throw_if_broken(description_);
    cuda::stream_wait_event(cuda::current_stream(device_), done_);
  }
  bool is_completed() override { return cuda::event_query(done_); }

  cuda::Event done() const { return done_; }
  const std::string& description() const { return description_; }
  Clock::time_point started() const { return started_; }

 private:
  std::shared_ptr<NcclState> state_;
  std::string description_;
  int device_;
  cuda::Event done_;
  std::vector<Tensor> keep_alive_;  // until the collective finished
  Clock::time_point started_;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(TCPStore& store, const std::string& prefix, int rank, int size, int device,
              std::chrono::milliseconds timeout)
      : state_(std::make_shared<NcclState>()), device_(device), timeout_(timeout) {
    state_->where = "NCCL, rank " + std::to_string(rank) + " of " + std::to_string(size) + ", cuda:" +
                    std::to_string(device);
    KILN_CHECK(cuda::compiled_with_cuda(), "ProcessGroup: a CUDA tensor needs NCCL, but kiln was built without CUDA");
    nccl::UniqueId id{};
    const std::string key = prefix + "unique_id";
    if (rank == 0) {
      id = nccl::get_unique_id();
      store.set(key, std::vector<char>(id.bytes, id.bytes + sizeof(id.bytes)));
    } else {
      const std::vector<char> bytes = store.get(key);
      KILN_ASSERT(bytes.size() == sizeof(id.bytes), "NCCL unique id of ", bytes.size(), " bytes");
      std::copy(bytes.begin(), bytes.end(), id.bytes);
    }
    comm_ = nccl::comm_init_rank(id, size, rank, device, timeout.count());
    stream_ = cuda::create_stream(device);
    ready_ = cuda::create_event(device, /*timing=*/false);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclBackend() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
    try {
      if (!broken()) nccl::comm_destroy(comm_);
      cuda::destroy_event(ready_);
      cuda::destroy_stream(stream_);
    } catch (const Error&) {
      // A destructor must not throw; the process is likely exiting after a failure.
    }
  }

  WorkHandle all_reduce(const Tensor& tensor, ReduceOp op) override {
    return launch(describe("all_reduce", tensor) + " " + reduce_op_name(op), {tensor}, [&](cuda::Stream s) {
      nccl::all_reduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), tensor.dtype(), to_nccl(op), comm_, s,
                       timeout_.count());
    });
  }
  WorkHandle broadcast(const Tensor& tensor, int root) override {
    return launch(describe("broadcast", tensor), {tensor}, [&](cuda::Stream s) {
      nccl::broadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), tensor.dtype(), root, comm_, s,
                      timeout_.count());
    });
  }
  WorkHandle all_gather(const Tensor& output, const Tensor& input) override {
    return launch(describe("all_gather", input), {output, input}, [&](cuda::Stream s) {
      nccl::all_gather(input.data_ptr(), output.data_ptr(), input.numel(), input.dtype(), comm_, s,
                       timeout_.count());
    });
  }
  WorkHandle reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    return launch(describe("reduce_scatter", input) + " " + reduce_op_name(op), {output, input},
                  [&](cuda::Stream s) {
                    nccl::reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(), input.dtype(),
                                         to_nccl(op), comm_, s, timeout_.count());
                  });
  }
  WorkHandle barrier() override { KILN_THROW("barrier: ProcessGroup runs barriers through Gloo"); }

 private:
  std::string describe(const char* op, const Tensor& tensor) const {
    return std::string(op) + " of " + std::to_string(tensor.numel()) + " x " + std::string(dtype_name(tensor.dtype()));
  }

  template <typename Call>
  WorkHandle launch(std::string description, std::vector<Tensor> tensors, Call&& call) {
    std::lock_guard<std::mutex> comm_lock(comm_mutex_);
    state_->throw_if_broken(description);
    for (const Tensor& t : tensors) {
      KILN_CHECK(t.device().index == device_, description, ": the tensor is on ", t.device().str(),
                 " but this communicator uses cuda:", device_);
    }
    auto work = std::make_shared<NcclWork>(state_, std::move(description), device_, std::move(tensors));
    // Order the collective after the work already queued on the caller's stream.
    cuda::record_event(ready_, cuda::current_stream(device_));
    cuda::stream_wait_event(stream_, ready_);
    try {
      call(stream_);
    } catch (const Error& e) {
      break_communicator(e.message());
      throw;
    }
    cuda::record_event(work->done(), stream_);
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      pending_.push_back(work);
    }
    watch_cv_.notify_all();
    return work;
  }

  // The first failure marks the backend broken and aborts the communicator,
  // exactly once (abort frees it; the destructor then leaves it alone). The
  // caller holds comm_mutex_, so no launch races the abort.
  void break_communicator(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->error.empty()) return;
      state_->error = why;
    }
    nccl::comm_abort(comm_);
  }

  bool broken() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return !state_->error.empty();
  }

  // Polls pending collectives; aborts the communicator on a timeout or an
  // asynchronous error. comm_mutex_ keeps an abort from racing a launch.
  void watch() {
    // This thread's CUDA calls (event queries) run on the communicator's
    // device: on a new thread's default device 0 they would create a context
    // there, a few hundred MB of GPU 0 for every rank that uses another GPU.
    std::optional<cuda::DeviceGuard> on_device;
    try {
      on_device.emplace(device_, "NCCL watchdog");
    } catch (const Error& e) {
      std::lock_guard<std::mutex> comm_lock(comm_mutex_);
      break_communicator(std::string("NCCL watchdog: ") + e.message());
    }
    for (;;) {
      std::string failure;
      {
        std::unique_lock<std::mutex> lock(watch_mutex_);
        watch_cv_.wait_for(lock, std::chrono::milliseconds(pending_.empty() ? 500 : 20));
        if (stopping_) return;
        while (!pending_.empty()) {
          auto& work = pending_.front();
          bool finished = false;
          try {
            finished = cuda::event_query(work->done());
          } catch (const Error& e) {
            failure = work->description() + ": " + e.message();
            break;
          }
          if (finished) {
            pending_.pop_front();
            continue;
          }
          if (Clock::now() - work->started() > timeout_) {
            failure = work->description() + " timed out after " + std::to_string(timeout_.count()) +
                      " ms (a peer process died or did not reach this collective)";
          }
          break;
        }
      }
      std::lock_guard<std::mutex> comm_lock(comm_mutex_);
      if (broken()) continue;  // already aborted: never touch the communicator again
      if (failure.empty()) {
        const std::string async = nccl::comm_async_error(comm_);
        if (!async.empty()) failure = "asynchronous NCCL error: " + async + " (a peer process may have died)";
      }
      if (!failure.empty()) break_communicator(failure);
    }
  }

  std::shared_ptr<NcclState> state_;
  int device_;
  std::chrono::milliseconds timeout_;
  nccl::Comm comm_ = nullptr;
  cuda::Stream stream_ = nullptr;
  cuda::Event ready_ = nullptr;
  std::mutex comm_mutex_;
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  std::deque<std::shared_ptr<NcclWork>> pending_;
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(TCPStore& store, const std::string& prefix, int rank, int size, int device,
                                           std::chrono::milliseconds timeout) {
  return std::make_unique<NcclBackend>(store, prefix, rank, size, device, timeout);
}

}  // namespace kiln::distributed
