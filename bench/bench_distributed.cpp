// all_reduce bandwidth, 1 MiB to 256 MiB of float32: Gloo (CPU tensors, TCP
// on loopback) with --nproc processes, then NCCL with one process per GPU
// where there are GPUs (one GPU: a single rank, i.e. NCCL's local copy path).
//
//   build/bin/bench_distributed [--nproc 2] [--max-mb 256]
//   build/bin/kiln-run --nproc-per-node 2 -- build/bin/bench_distributed   (Gloo only)
//
// Standalone, it hosts the rendezvous store and starts the ranks itself
// (fork + exec of this binary). Each size: a barrier, warm-up, then the median
// of several timed all_reduce(sum) calls, each waited for (NCCL: and the
// stream synchronized). algbw = bytes / time; busbw = algbw * 2 (n - 1) / n,
// as nccl-tests reports it (the bytes each rank sends and receives in a ring).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/distributed/process_group.h"
#include "kernels/cuda/runtime.h"

using namespace kiln;
using namespace kiln::distributed;

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void run_worker(const std::string& backend, int max_mb) {
  auto group = init_process_group();
  const bool nccl = backend == "nccl";
  const Device device = nccl ? Device::cuda(read_torchrun_env().local_rank % cuda::device_count()) : Device::cpu();
  if (nccl) cuda::set_device(device.index);
  const int n = group->size();
  if (group->rank() == 0) {
    std::printf("\nall_reduce(sum), float32, %s, %d rank(s)%s\n", nccl ? "NCCL" : "Gloo (TCP, loopback)", n,
                nccl ? (" on " + std::string(cuda::device_properties(device.index).name)).c_str() : "");
    std::printf("%10s %8s %12s %12s %12s\n", "size", "repeats", "time (ms)", "algbw GB/s", "busbw GB/s");
  }
  for (int mb = 1; mb <= max_mb; mb *= 2) {
    const int64_t elements = int64_t{mb} << 18;  // MiB / 4 bytes
    Tensor t = full({elements}, 1.0, {.device = device});
    const int repeats = std::clamp(512 / mb, 3, 20);
    auto once = [&] {
      group->all_reduce(t)->wait();
      if (nccl) cuda::stream_synchronize(cuda::current_stream(device.index));
    };
    group->barrier()->wait();
    once();  // warm-up (connections, buffers)
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      group->barrier()->wait();
      const auto start = Clock::now();
      once();
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    const double time_ms = median(ms);
    const double bytes = static_cast<double>(elements) * 4;
    const double algbw = bytes / (time_ms * 1e-3) / 1e9;
    if (group->rank() == 0) {
      std::printf("%7d MiB %8d %12.3f %12.2f %12.2f\n", mb, repeats, time_ms, algbw,
                  n > 1 ? algbw * 2.0 * (n - 1) / n : algbw);
      std::fflush(stdout);
    }
  }
  group->barrier()->wait();
  destroy_process_group();
}

// Hosts the store and runs `nproc` ranks of this binary; returns false when one failed.
bool spawn_job(const std::string& backend, int nproc, int max_mb) {
  TCPStore store("127.0.0.1", 0, true);
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(store.port()).c_str(), 1);
      ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
      ::setenv("KILN_BENCH_BACKEND", backend.c_str(), 1);
      ::setenv("KILN_BENCH_MAX_MB", std::to_string(max_mb).c_str(), 1);
      if (!std::getenv("OMP_NUM_THREADS")) ::setenv("OMP_NUM_THREADS", "1", 1);
      ::execl(exe.c_str(), exe.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (launched_distributed()) {  // a rank (of kiln-run, or of spawn_job below)
      const char* backend = std::getenv("KILN_BENCH_BACKEND");
      const char* max_mb = std::getenv("KILN_BENCH_MAX_MB");
      run_worker(backend ? backend : "gloo", max_mb ? std::atoi(max_mb) : 256);
      return 0;
    }
    int nproc = 2, max_mb = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
      if (!std::strcmp(argv[i], "--nproc")) nproc = std::max(1, std::atoi(argv[i + 1]));
      if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::max(1, std::atoi(argv[i + 1]));
    }
    std::fflush(stdout);
    bool ok = spawn_job("gloo", nproc, max_mb);
    const int gpus = cuda::device_count();
    if (gpus > 0) {
      if (gpus < 2) std::printf("\n(one GPU: NCCL runs one rank, i.e. its local copy path, not a network all_reduce)\n");
      std::fflush(stdout);
      ok = spawn_job("nccl", std::min(gpus, std::max(nproc, 1)), max_mb) && ok;
    } else {
      std::printf("\nNCCL: no GPU here, skipped\n");
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_distributed: %s\n", e.what());
    return 1;
  }
}
