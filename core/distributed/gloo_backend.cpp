// The Gloo backend (CPU tensors): a full TCP mesh made through the TCPStore,
// and one worker thread that runs the group's collectives in the order they
// were issued (so every rank runs them in the same order) with the group's
// timeout. Reductions are kiln's own functions, so every dtype works
// (16-bit floats reduce in float). reduce_scatter is an all_reduce of a copy
// of the input followed by a copy of this rank's slice: Gloo's own reduce-
// scatter algorithm has no timeout.
//
// When a collective fails (a peer's connection closed, or the timeout passed)
// the rank closes its connections, so that the ranks waiting on it fail at
// once instead of after their own timeout, and announces the failure in the
// store. Every rank runs a monitor thread that answers such an announcement
// (it looks every 250 ms, on a store connection of its own), even while its
// collective hangs. The failed rank waits a short grace (failure_grace) for
// the answers and names in its error the ranks that gave none: those stopped
// answering (the idea of torch's monitored_barrier; Gloo's own message names
// an address, not a rank).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <thread>

#include "core/distributed/process_group.h"
#include "kernels/error.h"

namespace kiln::distributed {

namespace {

// Gloo's rendezvous reaches the TCPStore through this, under a key prefix.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(TCPStore& store, std::string prefix) : store_(store), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(prefix_ + key, data); }
  std::vector<char> get(const std::string& key) override { return store_.get(prefix_ + key); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> prefixed;
    for (const auto& key : keys) prefixed.push_back(prefix_ + key);
    store_.wait(prefixed, timeout);
  }

 private:
  TCPStore& store_;
  std::string prefix_;
};

// ---------------------------------------------------------------- reductions

template <typename T, typename Acc, ReduceOp op>
void reduce_loop(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    const Acc u = static_cast<Acc>(x[i]), v = static_cast<Acc>(y[i]);
    Acc r;
    if constexpr (op == ReduceOp::sum || op == ReduceOp::avg) {
      r = u + v;
    } else if constexpr (op == ReduceOp::max) {
      r = u < v ? v : u;
    } else {
      r = v < u ? v : u;
    }
    o[i] = static_cast<T>(r);
  }
}

// Booleans: sum and max are "or", min is "and".
template <ReduceOp op>
void reduce_bool(void* out, const void* a, const void* b, size_t n) {
  uint8_t* o = static_cast<uint8_t*>(out);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = op == ReduceOp::min ? (x[i] && y[i]) : (x[i] || y[i]);
}

template <typename T, typename Acc>
gloo::AllreduceOptions::Func reduce_for_type(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_loop<T, Acc, ReduceOp::sum>;
    case ReduceOp::avg: return reduce_loop<T, Acc, ReduceOp::avg>;
    case ReduceOp::max: return reduce_loop<T, Acc, ReduceOp::max>;
    case ReduceOp::min: return reduce_loop<T, Acc, ReduceOp::min>;
  }
  KILN_THROW("gloo: unknown reduction");
}

gloo::AllreduceOptions::Func reduce_function(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return reduce_for_type<float, float>(op);
    case DType::f64: return reduce_for_type<double, double>(op);
    case DType::f16: return reduce_for_type<Half, float>(op);
    case DType::bf16: return reduce_for_type<BFloat16, float>(op);
    case DType::i32: return reduce_for_type<int32_t, int32_t>(op);
    case DType::i64: return reduce_for_type<int64_t, int64_t>(op);
    case DType::u8: return reduce_for_type<uint8_t, uint8_t>(op);
    case DType::b8:
      return op == ReduceOp::min ? gloo::AllreduceOptions::Func(reduce_bool<ReduceOp::min>)
                                 : gloo::AllreduceOptions::Func(reduce_bool<ReduceOp::max>);
  }
  KILN_THROW("gloo: unsupported dtype ", dtype_name(dtype));
}

// Divides n floating elements by `divisor` (the avg of an all_reduce).
void divide(void* data, size_t n, DType dtype, int divisor) {
  auto loop = [&](auto* p) {
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(p[i]) / static_cast<float>(divisor);
  };
  switch (dtype) {
    case DType::f32: loop(static_cast<float*>(data)); break;
    case DType::f16: loop(static_cast<Half*>(data)); break;
    case DType::bf16: loop(static_cast<BFloat16*>(data)); break;
    case DType::f64: {
      double* p = static_cast<double*>(data);
      for (size_t i = 0; i < n; ++i) p[i] /= divisor;
      break;
    }
    default: KILN_THROW("all_reduce: avg needs a floating dtype, got ", dtype_name(dtype));
  }
}

// Gloo's typed setters only read sizeof(T): pick an integer type of the element's size.
template <typename Fn>
void with_element_type(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1: fn(static_cast<uint8_t*>(nullptr)); break;
    case 2: fn(static_cast<uint16_t*>(nullptr)); break;
    case 4: fn(static_cast<uint32_t*>(nullptr)); break;
    case 8: fn(static_cast<uint64_t*>(nullptr)); break;
    default: KILN_THROW("gloo: unsupported element size ", element_size);
  }
}

// ---------------------------------------------------------------- work

class GlooWork final : public Work {
 public:
  GlooWork(std::string description, std::function<void()> run, std::vector<Tensor> keep_alive)
      : description_(std::move(description)), run_(std::move(run)), keep_alive_(std::move(keep_alive)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) throw Error(error_, __FILE__, __LINE__);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  const std::string& description() const { return description_; }
  // Runs on the worker thread; returns the error message (empty when it succeeded).
  std::string execute() {
    std::string error;
    try {
      run_();
    } catch (const std::exception& e) {
      error = e.what();
    }
    return error;
  }
  void finish(std::string error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
      run_ = nullptr;
      keep_alive_.clear();
    }
    done_cv_.notify_all();
  }

 private:
  std::string description_;
  std::function<void()> run_;
  std::vector<Tensor> keep_alive_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string error_;
};

// ---------------------------------------------------------------- failure report
//
// Store keys under the group's prefix: "failed" (some rank's collective
// failed), "failed/<r>" (rank r's failure, its message), "alive/<r>" (rank r
// saw "failed" and answers: its process lives, even when it is stuck in a
// collective waiting for a dead peer).

// How long a failed rank waits for the others' answers: long enough for every
// live rank's monitor (which looks every kMonitorPeriod) to answer, short
// against the timeout.
constexpr std::chrono::milliseconds kMonitorPeriod(250);
std::chrono::milliseconds failure_grace(std::chrono::milliseconds timeout) {
  return std::min<std::chrono::milliseconds>(std::chrono::seconds(5), timeout / 2);
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
  return text;
}

// Announces this rank's failure and names the ranks that gave no sign of life
// (neither failed themselves nor answered) within the grace. Never throws: a
// store that cannot be reached is said in the text (its host, node 0, may be
// the one that was lost).
std::string name_silent_ranks(const std::string& store_host, int store_port, const std::string& prefix, int rank,
                              int size, std::chrono::milliseconds grace, const std::string& failure) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  try {
    // A connection of its own: the group's store client waits as long as the group's timeout.
    TCPStore client(store_host, store_port, false, grace);
    client.set(prefix + "failed/" + std::to_string(rank), failure);
    client.set(prefix + "failed", std::string("1"));
    std::vector<int> waiting, failed, alive;
    for (int r = 0; r < size; ++r) {
      if (r != rank) waiting.push_back(r);
    }
    for (;;) {
      std::vector<int> still_waiting;
      for (int r : waiting) {
        if (client.check({prefix + "failed/" + std::to_string(r)})) {
          failed.push_back(r);
        } else if (client.check({prefix + "alive/" + std::to_string(r)})) {
          alive.push_back(r);
        } else {
          still_waiting.push_back(r);
        }
      }
      waiting = std::move(still_waiting);
      if (waiting.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::sort(failed.begin(), failed.end());
    std::sort(alive.begin(), alive.end());
    std::string text = waiting.empty()
                           ? std::string("no rank is gone")
                           : std::string(waiting.size() == 1 ? "rank " : "ranks ") + join_ranks(waiting) +
                                 " stopped answering (no sign of life within " + std::to_string(grace.count()) +
                                 " ms of this failure)";
    if (!failed.empty()) text += "; failed too: rank(s) " + join_ranks(failed);
    if (!alive.empty()) text += "; alive, but not done with this collective: rank(s) " + join_ranks(alive);
    return text;
  } catch (const std::exception& e) {
    return "could not ask the store at " + store_host + ":" + std::to_string(store_port) +
           " which rank stopped answering (its host, where rank 0 runs, may be the one lost): " + e.what();
  }
}

// ---------------------------------------------------------------- backend

class GlooBackend final : public Backend {
 public:
  GlooBackend(TCPStore& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout,
              const std::string& hostname)
      : rank_(rank),
        size_(size),
        timeout_(timeout),
        prefix_(prefix),
        store_host_(store.is_server() ? std::string("127.0.0.1") : store.host()),
        store_port_(store.port()) {
    gloo::transport::tcp::attr attr;
    if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface && hostname.empty()) {
      attr.iface = iface;
    } else {
      attr.hostname = hostname;
    }
    StoreAdapter adapter(store, prefix);
    // Writing to the socket of a peer that died raises SIGPIPE, which would
    // kill this process instead of giving an error. Block it in the threads
    // that do Gloo's I/O: this one while connecting, and the ones started here
    // (Gloo's event loop, our worker), which inherit the mask.
    sigset_t pipe_signal, previous;
    sigemptyset(&pipe_signal);
    sigaddset(&pipe_signal, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_signal, &previous);
    struct RestoreMask {
      sigset_t pipe_signal, previous;
      ~RestoreMask() {
        // Drop a SIGPIPE left pending on this thread before unblocking it.
        timespec zero{0, 0};
        sigset_t pending;
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE)) sigtimedwait(&pipe_signal, nullptr, &zero);
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      }
    } restore{pipe_signal, previous};
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
      context->setTimeout(timeout);
      context->connectFullMesh(adapter, device);
      context_ = context;
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      KILN_THROW("ProcessGroup (Gloo, rank ", rank, " of ", size, "): connecting to the other ranks at ",
                 attr.hostname.empty() ? attr.iface : attr.hostname, " failed: ", e.what());
    }
    worker_ = std::thread([this] { run_worker(); });
    if (size_ > 1) monitor_ = std::thread([this] { run_monitor(); });
  }

  ~GlooBackend() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    monitor_cv_.notify_all();
    worker_.join();
    if (monitor_.joinable()) monitor_.join();  // wakes within kMonitorPeriod (plus one store call)
  }

  WorkHandle all_reduce(const Tensor& tensor, ReduceOp op) override {
    void* data = tensor.data_ptr();
    const size_t n = static_cast<size_t>(tensor.numel());
    const DType dtype = tensor.dtype();
    auto reduce = reduce_function(dtype, op);
    return submit(describe("all_reduce", tensor) + " " + reduce_op_name(op), {tensor}, [=, this](uint32_t tag) {
      if (n == 0) return;
      gloo::AllreduceOptions opts(context_);
      with_element_type(dtype_size(dtype), [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        opts.setOutput(static_cast<T*>(data), n);
      });
      opts.setReduceFunction(reduce);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
      if (op == ReduceOp::avg) divide(data, n, dtype, size_);
    });
  }

  WorkHandle broadcast(const Tensor& tensor, int root) override {
    void* data = tensor.data_ptr();
    const size_t n = static_cast<size_t>(tensor.numel());
    const size_t element = tensor.element_size();
    return submit(describe("broadcast", tensor) + " from rank " + std::to_string(root), {tensor},
                  [=, this](uint32_t tag) {
                    if (n == 0) return;
                    gloo::BroadcastOptions opts(context_);
                    with_element_type(element, [&](auto* type) {
                      using T = std::remove_pointer_t<decltype(type)>;
                      opts.setOutput(static_cast<T*>(data), n);
                    });
                    opts.setRoot(root);
                    opts.setTag(tag);
                    opts.setTimeout(timeout_);
                    gloo::broadcast(opts);
                  });
  }

  WorkHandle all_gather(const Tensor& output, const Tensor& input) override {
    void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t n = static_cast<size_t>(input.numel());
    const size_t element = input.element_size();
    const int size = size_;
    return submit(describe("all_gather", input), {output, input}, [=, this](uint32_t tag) {
      if (n == 0) return;
      gloo::AllgatherOptions opts(context_);
      with_element_type(element, [&](auto* type) {
        using T = std::remove_pointer_t<decltype(type)>;
        opts.setInput(static_cast<T*>(in), n);
        opts.setOutput(static_cast<T*>(out), n * size);
      });
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  WorkHandle reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t n = static_cast<size_t>(input.numel());
    const size_t chunk = static_cast<size_t>(output.numel());
    const DType dtype = input.dtype();
    const size_t element = input.element_size();
    auto reduce = reduce_function(dtype, op);
    const int rank = rank_;
    return submit(describe("reduce_scatter", input) + " " + reduce_op_name(op), {output, input},
                  [=, this](uint32_t tag) {
                    if (n == 0) return;
                    std::vector<char> scratch(static_cast<const char*>(in), static_cast<const char*>(in) + n * element);
                    gloo::AllreduceOptions opts(context_);
                    with_element_type(element, [&](auto* type) {
                      using T = std::remove_pointer_t<decltype(type)>;
                      opts.setOutput(reinterpret_cast<T*>(scratch.data()), n);
                    });
                    opts.setReduceFunction(reduce);
                    opts.setTag(tag);
                    opts.setTimeout(timeout_);
                    gloo::allreduce(opts);
                    std::memcpy(out, scratch.data() + rank * chunk * element, chunk * element);
                    if (op == ReduceOp::avg) divide(out, chunk, dtype, size_);
                  });
  }

  WorkHandle barrier() override {
    return submit("barrier", {}, [this](uint32_t tag) {
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  std::string describe(const char* op, const Tensor& tensor) const {
    return std::string(op) + " of " + std::to_string(tensor.numel()) + " x " + std::string(dtype_name(tensor.dtype()));
  }

  WorkHandle submit(std::string description, std::vector<Tensor> keep_alive, std::function<void(uint32_t)> run) {
    std::lock_guard<std::mutex> lock(mutex_);
    KILN_CHECK(broken_.empty(), description, " (Gloo, rank ", rank_, " of ", size_,
               "): the process group is unusable after an earlier failure: ", broken_);
    // Tags are issued in the same order on every rank; each collective gets its own.
    const uint32_t tag = next_tag_++;
    auto work = std::make_shared<GlooWork>(std::move(description), [run = std::move(run), tag] { run(tag); },
                                           std::move(keep_alive));
    queue_.push_back(work);
    queue_cv_.notify_one();
    return work;
  }

  // Answers another rank's failure report ("alive/<rank>"), so that it names
  // only the ranks that are gone; looks every kMonitorPeriod. Ends then, when
  // the store is gone (nothing left to answer), or when the backend closes.
  void run_monitor() {
    std::unique_ptr<TCPStore> client;
    const std::chrono::milliseconds store_timeout = failure_grace(timeout_);
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (monitor_cv_.wait_for(lock, kMonitorPeriod, [&] { return stopping_; })) return;
      }
      try {
        if (!client) client = std::make_unique<TCPStore>(store_host_, store_port_, false, store_timeout);
        if (client->check({prefix_ + "failed"})) {
          client->set(prefix_ + "alive/" + std::to_string(rank_), std::string("1"));
          return;
        }
      } catch (const std::exception&) {
        return;
      }
    }
  }

  void run_worker() {
    for (;;) {
      std::shared_ptr<GlooWork> work;
      std::string broken;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = queue_.front();
        queue_.pop_front();
        broken = broken_;
      }
      std::string error;
      if (!broken.empty()) {
        error = "the process group is unusable after an earlier failure: " + broken;
      } else {
        error = work->execute();
        if (!error.empty()) {
          error += " (a peer process died, or did not reach this collective within " +
                   std::to_string(timeout_.count()) + " ms)";
          // Only this thread uses the context. Closing its connections now fails the ranks
          // waiting on this one at once (dropping the context alone did not always close them).
          try {
            context_->closeConnections();
          } catch (const std::exception&) {  // a connection that cannot close is closed enough
          }
          context_.reset();
          if (size_ > 1) {
            error += "; " + name_silent_ranks(store_host_, store_port_, prefix_, rank_, size_,
                                              failure_grace(timeout_), work->description() + ": " + error);
          }
          // Set only now: a collective issued meanwhile waits in the queue and then fails with
          // the whole story (an earlier refusal in submit would lack the silent ranks).
          std::lock_guard<std::mutex> lock(mutex_);
          broken_ = work->description() + ": " + error;
        }
      }
      if (!error.empty()) {
        error = work->description() + " (Gloo, rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                ") failed: " + error;
      }
      work->finish(std::move(error));
    }
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::string prefix_;  // the group's store keys (failure reports go under it)
  std::string store_host_;
  int store_port_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::condition_variable monitor_cv_;  // the monitor's sleep, cut short by the destructor
  std::deque<std::shared_ptr<GlooWork>> queue_;
  bool stopping_ = false;
  std::string broken_;
  uint32_t next_tag_ = 0;
  std::thread worker_;
  std::thread monitor_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(TCPStore& store, const std::string& prefix, int rank, int size,
                                           std::chrono::milliseconds timeout, const std::string& hostname) {
  return std::make_unique<GlooBackend>(store, prefix, rank, size, timeout, hostname);
}

}  // namespace kiln::distributed
