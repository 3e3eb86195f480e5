// kiln-run: starts the worker processes of a data-parallel job, after torchrun.
//
//   kiln-run --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]
//            [--max-restarts K] -- program args...
//
// Each worker gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS) and KILN_RUN_START_TIME,
// when this launcher started (seconds since the Unix epoch: a restarted Trainer
// resumes only from checkpoints written since, trainer.h). The launcher of node
// 0 hosts the rendezvous store at MASTER_ADDR:MASTER_PORT for the whole run
// (TORCHELASTIC_USE_AGENT_STORE=True tells the workers to connect to it; keys
// are kept apart per restart round), so no other service is needed; with one
// node, --master-port 0 picks a free port. Worker output is prefixed with
// "[rank R] ". SIGINT/SIGTERM/SIGHUP are forwarded to every worker. When a
// worker fails, the others are stopped (SIGTERM, then SIGKILL after 5 s);
// with --max-restarts K the whole group is started again up to K times (a
// Trainer resumes from its last checkpoint by itself; another program from its
// own). Exit status: 0 when every worker
// succeeded; else the failed worker's exit code (128 + signal when killed).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/distributed/tcp_store.h"
#include "examples/cli_checks.h"

namespace {

using Clock = std::chrono::steady_clock;

int signal_pipe[2] = {-1, -1};

void on_signal(int signal_number) {
  const char byte = static_cast<char>(signal_number);
  [[maybe_unused]] const ssize_t ignored = ::write(signal_pipe[1], &byte, 1);
}

void say(const std::string& text) {
  std::fprintf(stderr, "[kiln-run] %s\n", text.c_str());
  std::fflush(stderr);
}

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  std::vector<std::string> command;
  std::string run_start_time;  // KILN_RUN_START_TIME: the same for every round of the run
};

// One output stream of a worker, forwarded line by line with a rank prefix.
struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string pending;

  void emit(const std::string& prefix, bool flush_partial) {
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos; start = newline + 1) {
      std::fprintf(sink, "%s%.*s\n", prefix.c_str(), static_cast<int>(newline - start), pending.data() + start);
    }
    pending.erase(0, start);
    if (flush_partial && !pending.empty()) {
      std::fprintf(sink, "%s%s\n", prefix.c_str(), pending.c_str());
      pending.clear();
    }
    std::fflush(sink);
  }
  // Reads what is available; returns false at end of stream.
  bool drain(const std::string& prefix) {
    char buffer[65536];
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (got <= 0) {
      emit(prefix, true);
      ::close(fd);
      fd = -1;
      return false;
    }
    pending.append(buffer, static_cast<size_t>(got));
    emit(prefix, false);
    return true;
  }
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
  std::string prefix() const { return "[rank " + std::to_string(rank) + "] "; }
};

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

pid_t spawn(const Options& o, int local_rank, int restart, int port, Worker& worker) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    say(std::string("pipe2 failed: ") + std::strerror(errno));
    return -1;
  }
  const int world = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Child: own process group (signals are forwarded explicitly), die with the launcher.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    auto set = [](const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); };
    set("RANK", std::to_string(rank));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_RANK", std::to_string(local_rank));
    set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
    set("GROUP_RANK", std::to_string(o.node_rank));
    set("MASTER_ADDR", o.master_addr);
    set("MASTER_PORT", std::to_string(port));
    set("TORCHELASTIC_RESTART_COUNT", std::to_string(restart));
    set("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts));
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    set("KILN_RUN_START_TIME", o.run_start_time);
    if (!std::getenv("OMP_NUM_THREADS") && o.nproc_per_node > 1) {
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      set("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / static_cast<unsigned>(o.nproc_per_node))));
    }
    std::vector<char*> argv;
    for (const auto& arg : o.command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "kiln-run: cannot execute '%s': %s\n", argv[0], std::strerror(errno));
    std::fflush(stderr);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (pid < 0) {
    say(std::string("fork failed: ") + std::strerror(errno));
    ::close(out[0]);
    ::close(err[0]);
    return -1;
  }
  ::setpgid(pid, pid);  // also here, so that a signal sent right away reaches the group
  worker.rank = rank;
  worker.pid = pid;
  worker.running = true;
  worker.out = {out[0], stdout, ""};
  worker.err = {err[0], stderr, ""};
  return pid;
}

void signal_all(std::vector<Worker>& workers, int signal_number) {
  for (auto& w : workers)
    if (w.running) ::kill(-w.pid, signal_number);
}

// Forwards output and reaps exits until every worker finished, one failed
// (then the others are stopped), or a signal arrived. Returns the exit status
// for the run and sets `failed` when a worker failed.
int monitor(std::vector<Worker>& workers, bool& failed, int& received_signal) {
  failed = false;
  received_signal = 0;
  int first_failure = 0;
  std::optional<Clock::time_point> kill_deadline;
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    for (auto& w : workers) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&w, s);
      }
    }
    fds.push_back({signal_pipe[0], POLLIN, 0});
    ::poll(fds.data(), fds.size(), 50);
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents) owners[i].second->drain(owners[i].first->prefix());
    }
    if (fds.back().revents) {
      char byte = 0;
      if (::read(signal_pipe[0], &byte, 1) == 1 && !received_signal) {
        received_signal = byte;
        say(std::string("received ") + strsignal(byte) + ": forwarding it to the workers");
        signal_all(workers, byte);
        kill_deadline = Clock::now() + std::chrono::seconds(10);
      }
    }
    for (auto& w : workers) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.running = false;
      w.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !failed && !received_signal) {
        failed = true;
        first_failure = exit_code_of(status);
        say("worker rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") " +
            describe_status(status) + ": stopping the other workers");
        signal_all(workers, SIGTERM);
        kill_deadline = Clock::now() + std::chrono::seconds(5);
      }
    }
    if (kill_deadline && Clock::now() > *kill_deadline) {
      signal_all(workers, SIGKILL);
      kill_deadline.reset();
    }
    const bool any_running = std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
    const bool any_open = std::any_of(workers.begin(), workers.end(),
                                      [](const Worker& w) { return w.out.fd >= 0 || w.err.fd >= 0; });
    // Grandchildren may keep a pipe open: stop reading once every worker exited.
    if (!any_running) {
      if (any_open) {
        for (auto& w : workers) {
          for (Stream* s : {&w.out, &w.err}) {
            if (s->fd < 0) continue;
            ::fcntl(s->fd, F_SETFL, ::fcntl(s->fd, F_GETFL) | O_NONBLOCK);
            while (s->fd >= 0) {
              char buffer[65536];
              const ssize_t got = ::read(s->fd, buffer, sizeof(buffer));
              if (got <= 0) {
                s->emit(w.prefix(), true);
                ::close(s->fd);
                s->fd = -1;
              } else {
                s->pending.append(buffer, static_cast<size_t>(got));
              }
            }
          }
        }
      }
      if (received_signal) return 128 + received_signal;
      return failed ? first_failure : 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"kiln-run: start the workers of a data-parallel kiln job (torchrun's environment)"};
  app.add_option("--nproc-per-node", o.nproc_per_node, "workers on this node (one per GPU)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--nnodes", o.nnodes, "number of nodes")->check(CLI::Range(1, 65536));
  app.add_option("--node-rank", o.node_rank, "rank of this node in [0, nnodes)")->check(kiln::examples::kNonNegative);
  app.add_option("--master-addr", o.master_addr, "address of node 0 (hosts the rendezvous store)");
  app.add_option("--master-port", o.master_port, "port of the rendezvous store on node 0 (0: any free port, one node)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--max-restarts", o.max_restarts, "restart the whole group up to this many times after a failure")
      ->check(kiln::examples::kNonNegative);
  app.add_option("command", o.command, "the program and its arguments (after --)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // One line, as the training binaries (CLI11_PARSE adds "Run with --help ...").
    if (error.get_exit_code() == 0) return app.exit(error);
    say(std::string(error.what()) + " (see --help)");
    return error.get_exit_code();
  }
  {
    const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    char text[48];
    std::snprintf(text, sizeof(text), "%lld.%09lld", static_cast<long long>(seconds.count()),
                  static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch - seconds)
                                             .count()));
    o.run_start_time = text;
  }
  if (o.node_rank >= o.nnodes) {
    say("--node-rank " + std::to_string(o.node_rank) + " must be less than --nnodes " + std::to_string(o.nnodes));
    return 2;
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    say("--master-port 0 (any free port) works only with one node: the other nodes must know the port");
    return 2;
  }

  // Node 0 hosts the store for the whole run, restarts included.
  std::unique_ptr<kiln::distributed::TCPStore> store;
  int port = o.master_port;
  if (o.node_rank == 0) {
    try {
      store = std::make_unique<kiln::distributed::TCPStore>(o.master_addr, o.master_port, true);
      port = store->port();
    } catch (const std::exception& e) {
      say(e.what());
      return 1;
    }
  }

  if (::pipe2(signal_pipe, O_CLOEXEC) != 0) return 1;
  struct sigaction action{};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  for (int restart = 0;; ++restart) {
    std::vector<Worker> workers(o.nproc_per_node);
    for (int local = 0; local < o.nproc_per_node; ++local) {
      if (spawn(o, local, restart, port, workers[local]) < 0) {
        signal_all(workers, SIGKILL);
        return 1;
      }
    }
    bool failed = false;
    int received_signal = 0;
    const int code = monitor(workers, failed, received_signal);
    if (received_signal || !failed) return code;
    if (restart >= o.max_restarts) {
      say("giving up after " + std::to_string(restart) + " restart(s); exit code " + std::to_string(code));
      return code;
    }
    say("restarting all workers (restart " + std::to_string(restart + 1) + " of " + std::to_string(o.max_restarts) +
        ")");
  }
}
