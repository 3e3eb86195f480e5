// Two nodes over a real network on one machine: two network namespaces
// ("hosts" A, 10.231.0.1, and B, 10.231.0.2) joined by a veth pair, each
// running `kiln-run --nnodes 2 --node-rank R --master-addr 10.231.0.1
// --nproc-per-node 2`: 4 ranks over Gloo across the link. Only the two
// namespaces' addresses and their loopbacks exist there.
//
// Needs root and iproute2 (scripts/setup.sh installs it). Where namespaces
// cannot be made the cases say so and skip, unless KILN_REQUIRE_NETNS=1 (CI
// sets it: scripts/test.sh), which turns that into a failure. Every wait is
// bounded, and a guard kills every process left in the namespaces and deletes
// them when a case ends, failed or not (a later run also deletes namespaces
// left by a run that was itself killed).
//
// The workers are this binary's "netns_worker_entry": DDP training of the
// model of tests/support/ddp_reference.h, writing $KILN_NETNS_OUT/rank<R>.txt.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "core/distributed/process_group.h"
#include "nn/ddp.h"
#include "nn/loss.h"
#include "tests/support/ddp_reference.h"
#include "tests/test_distributed_util.h"

using namespace kiln;
using namespace kiln::testing::dist;
using namespace kiln::testing::ddp_reference;

namespace {

constexpr const char* kAddress[2] = {"10.231.0.1", "10.231.0.2"};
constexpr const char* kStorePort = "29500";  // inside namespace A: nothing else listens there
constexpr const char* kNamePrefix = "kiln-test-";

std::string env_string(const char* name, const char* fallback = "") {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// ---------------------------------------------------------------- worker side

// The distinct remote IPv4 addresses of this namespace's established TCP connections.
std::set<std::string> connected_addresses() {
  std::set<std::string> addresses;
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state != "01") continue;  // ESTABLISHED
    const unsigned long address = std::stoul(remote.substr(0, remote.find(':')), nullptr, 16);  // little-endian
    addresses.insert(std::to_string(address & 0xff) + "." + std::to_string((address >> 8) & 0xff) + "." +
                     std::to_string((address >> 16) & 0xff) + "." + std::to_string((address >> 24) & 0xff));
  }
  return addresses;
}

void write_result(const std::string& text) {
  const std::string path = env_string("KILN_NETNS_OUT") + "/rank" + env_string("RANK", "0") + ".txt";
  std::ofstream(path + ".tmp") << text;
  fs::rename(path + ".tmp", path);
}

// "parity": 3 DDP steps, then "buckets N", the parameters and the peers' addresses.
// "until_failure": steps until a collective fails; then "ERROR <ms of that step> <message>".
std::string train(const std::shared_ptr<distributed::ProcessGroup>& group, bool until_failure) {
  auto model = make_model(1234 + group->rank(), DType::f64);  // ranks start apart: DDP broadcasts rank 0's
  nn::DDPOptions options;
  options.bucket_cap_mb = 0.0001;  // a bucket per parameter: several all-reduces per step
  nn::DistributedDataParallel ddp(model, group, options);
  auto sgd = make_sgd(ddp);
  nn::MSELoss mse;
  const int64_t rows = 2, total = rows * group->size();
  const int steps = until_failure ? 1000000 : 3;
  for (int step = 0; step < steps; ++step) {
    if (until_failure) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto start = Clock::now();
    try {
      auto [x, y] = batch(step % 50, group->rank() * rows, rows, total, DType::f64);
      mse(ddp(x), y).backward();
      ddp.finish_gradient_sync();
    } catch (const Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      write_result("ERROR " + std::to_string(ms) + " step " + std::to_string(step) + " " + e.what());
      throw;
    }
    sgd->step();
    sgd->zero_grad();
    if (until_failure && step % 25 == 0) {
      std::printf("step %d done\n", step);
      std::fflush(stdout);
    }
  }
  std::string peers;
  for (const std::string& address : connected_addresses()) peers += " " + address;
  return "buckets " + std::to_string(ddp.bucket_parameter_names().size()) + "\n" + param_values(*model) +
         "\npeers" + peers + "\n";
}

}  // namespace

TEST_CASE("netns_worker_entry" * doctest::skip()) {
  const std::string scenario = env_string("KILN_NETNS_SCENARIO");
  if (scenario.empty()) return;
  try {
    auto group = distributed::init_process_group();
    write_result(train(group, scenario == "until_failure"));
    distributed::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker failed: %s\n", e.what());
    if (!fs::exists(env_string("KILN_NETNS_OUT") + "/rank" + env_string("RANK", "0") + ".txt")) {
      write_result(std::string("ERROR 0 ") + e.what());
    }
    throw;  // a failed worker exits non-zero, so that its launcher sees it
  }
}

// ---------------------------------------------------------------- parent side

namespace {

std::string find_ip() {
  for (const char* folder : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const fs::path ip = fs::path(folder) / "ip";
    if (::access(ip.c_str(), X_OK) == 0) return ip.string();
  }
  return "";
}

bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Two network namespaces joined by a veth pair, up, with their addresses.
// The destructor kills whatever runs in them and deletes them.
class TwoHosts {
 public:
  TwoHosts() : ip_(find_ip()) {
    if (::geteuid() != 0) {
      problem = "network namespaces need root";
      return;
    }
    if (ip_.empty()) {
      problem = "iproute2's `ip` is not installed (bash scripts/setup.sh installs it)";
      return;
    }
    remove_stale();
    const std::string id = std::to_string(::getpid());
    for (int h = 0; h < 2; ++h) names_[h] = kNamePrefix + id + (h == 0 ? "-a" : "-b");
    const std::string link[2] = {"kv" + id + "a", "kv" + id + "b"};  // at most 15 characters
    const std::vector<std::vector<std::string>> steps = {
        {"netns", "add", names_[0]},
        {"netns", "add", names_[1]},
        {"link", "add", link[0], "netns", names_[0], "type", "veth", "peer", "name", link[1], "netns", names_[1]},
        {"-n", names_[0], "addr", "add", std::string(kAddress[0]) + "/24", "dev", link[0]},
        {"-n", names_[1], "addr", "add", std::string(kAddress[1]) + "/24", "dev", link[1]},
        {"-n", names_[0], "link", "set", "lo", "up"},
        {"-n", names_[1], "link", "set", "lo", "up"},
        {"-n", names_[0], "link", "set", link[0], "up"},
        {"-n", names_[1], "link", "set", link[1], "up"}};
    for (const auto& step : steps) {
      std::string output;
      if (ip(step, &output) != 0) {
        problem = "`ip";
        for (const auto& arg : step) problem += " " + arg;
        problem += "` failed: " + output;
        return;
      }
      if (step[1] == "add" && step[0] == "netns") made_.push_back(step[2]);
    }
    links_[0] = link[0];
    links_[1] = link[1];
    ready_ = true;
  }
  ~TwoHosts() {
    for (const std::string& name : made_) {
      kill_all(name);
      ip({"netns", "del", name});
    }
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  bool ready() const { return ready_; }
  std::string problem;

  // `argv` run inside host `h`'s namespace (ip netns exec execs it: the pid is the program's).
  pid_t spawn_in(int h, const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                 const fs::path& log) {
    std::vector<std::string> command = {ip_, "netns", "exec", names_[h]};
    command.insert(command.end(), argv.begin(), argv.end());
    return spawn(command, env, log);
  }
  std::vector<pid_t> processes_in(int h) { return processes_in(names_[h]); }
  void kill_all(int h) { kill_all(names_[h]); }
  bool set_link(int h, bool up) { return ip({"-n", names_[h], "link", "set", links_[h], up ? "up" : "down"}) == 0; }

 private:
  // Runs ip with `args` (bounded: 20 s); returns its exit status, -1 when it did not finish.
  int ip(const std::vector<std::string>& args, std::string* output = nullptr) {
    std::vector<std::string> argv = {ip_};
    argv.insert(argv.end(), args.begin(), args.end());
    char pattern[] = "/tmp/kiln_ip_XXXXXX";
    const int fd = ::mkstemp(pattern);
    if (fd >= 0) ::close(fd);
    const int status = wait_all({spawn(argv, {}, pattern)}, 20).at(0);
    if (output) *output = read_file(pattern);
    ::unlink(pattern);
    return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::vector<pid_t> processes_in(const std::string& name) {
    std::string output;
    ip({"netns", "pids", name}, &output);
    std::vector<pid_t> pids;
    std::istringstream in(output);
    for (long pid; in >> pid;) pids.push_back(static_cast<pid_t>(pid));
    return pids;
  }
  // SIGKILL to every process in the namespace, until none is left (bounded).
  void kill_all(const std::string& name) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (auto pids = processes_in(name); !pids.empty() && Clock::now() < deadline; pids = processes_in(name)) {
      for (pid_t pid : pids) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Namespaces of an earlier run of these tests whose process is gone (it was killed before its guard ran).
  void remove_stale() {
    std::string output;
    ip({"netns", "list"}, &output);
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) {
      const std::string name = line.substr(0, line.find(' '));
      if (name.rfind(kNamePrefix, 0) != 0) continue;
      const pid_t owner = static_cast<pid_t>(std::atol(name.c_str() + std::string(kNamePrefix).size()));
      if (owner > 0 && alive(owner)) continue;
      kill_all(name);
      ip({"netns", "del", name});
    }
  }

  std::string ip_;
  std::string names_[2], links_[2];
  std::vector<std::string> made_;
  bool ready_ = false;
};

// True when the case may go on; otherwise a visible skip (or a failure under KILN_REQUIRE_NETNS=1).
bool require_hosts(const TwoHosts& hosts) {
  if (hosts.ready()) return true;
  if (env_string("KILN_REQUIRE_NETNS") == "1") FAIL("KILN_REQUIRE_NETNS=1 but " << hosts.problem);
  MESSAGE("SKIPPED (" << hosts.problem << "): the two-node case did not run");
  return false;
}

// The launcher of node `h` in its namespace, with the workers of `scenario`.
pid_t start_node(TwoHosts& hosts, int h, const std::string& scenario, const fs::path& dir, const std::string& timeout) {
  const fs::path launcher = fs::path(self_exe()).parent_path() / "kiln-run";
  REQUIRE_MESSAGE(fs::exists(launcher), "kiln-run not found next to kiln_tests: build the kiln-run target");
  std::vector<std::string> argv = {launcher.string(), "--nnodes", "2", "--node-rank", std::to_string(h),
                                   "--master-addr", kAddress[0], "--master-port", kStorePort,
                                   "--nproc-per-node", "2", "--"};
  for (const std::string& arg : worker_command("netns_worker_entry")) argv.push_back(arg);
  const std::map<std::string, std::string> env = {{"KILN_NETNS_SCENARIO", scenario},
                                                  {"KILN_NETNS_OUT", dir.string()},
                                                  {"KILN_DIST_TIMEOUT", timeout},
                                                  {"OMP_NUM_THREADS", "1"}};
  return hosts.spawn_in(h, argv, env, dir / (h == 0 ? "node_a.log" : "node_b.log"));
}

WorkerRun collect(const fs::path& dir, const std::vector<int>& launcher_statuses) {
  WorkerRun run;
  for (int r = 0; r < 4; ++r) {
    run.results.push_back(read_file(dir / ("rank" + std::to_string(r) + ".txt")));
    run.logs.push_back(r < 2 ? read_file(dir / "node_a.log") : read_file(dir / "node_b.log"));
    run.statuses.push_back(launcher_statuses.at(r / 2));
  }
  return run;
}

// Waits (up to `seconds`) until node a's and node b's logs show training progress.
bool wait_for_training(const fs::path& dir, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (read_file(dir / "node_a.log").find("[rank 0] step 25 done") != std::string::npos &&
        read_file(dir / "node_b.log").find("[rank 2] step 25 done") != std::string::npos) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// Starts both nodes on the "until_failure" scenario (collective timeout 30 s)
// and returns their launchers once both are training (the fault tests' start).
std::pair<pid_t, pid_t> start_training_nodes(TwoHosts& hosts, const fs::path& dir) {
  const pid_t a = start_node(hosts, 0, "until_failure", dir, "30");
  const pid_t b = start_node(hosts, 1, "until_failure", dir, "30");
  const bool training = wait_for_training(dir, 30);
  INFO(read_file(dir / "node_a.log").substr(0, 3000), "\n", read_file(dir / "node_b.log").substr(0, 3000));
  REQUIRE(training);
  return {a, b};
}

bool exited_with_failure(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) != 0; }

// Node A's workers failed within `max_ms` of their step's start, naming ranks
// 2 and 3. Node A's launcher stops its other worker as soon as one fails
// (both fail within milliseconds of each other), so the second one may be
// stopped before it has written its report: the first one's must be there.
void check_survivors(const WorkerRun& run, double max_ms) {
  const std::string& log = run.logs.at(0);
  const size_t said = log.find("[kiln-run] worker rank ");
  REQUIRE(said != std::string::npos);
  const int first = std::atoi(log.c_str() + said + 23);
  CHECK((first == 0 || first == 1));
  CHECK(log.find("exited with code 1", said) != std::string::npos);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    if (r != first && run.results[r].empty()) continue;  // stopped by its launcher before it reported
    REQUIRE(run.results[r].rfind("ERROR ", 0) == 0);
    const double ms = std::stod(run.results[r].substr(6, run.results[r].find(' ', 6) - 6));
    CHECK(ms <= max_ms);
    CHECK(run.results[r].find("Gloo") != std::string::npos);
    CHECK(run.results[r].find("ranks 2, 3 stopped answering") != std::string::npos);
  }
}

}  // namespace

TEST_CASE("Two nodes in network namespaces: 4 ranks over Gloo across a veth link equal one process on the "
          "global batch") {
  TwoHosts hosts;
  if (!require_hosts(hosts)) return;
  TempDir dir;
  const pid_t a = start_node(hosts, 0, "parity", dir.path, "20");
  const pid_t b = start_node(hosts, 1, "parity", dir.path, "20");
  const std::vector<int> statuses = wait_all({a, b}, 60);
  const WorkerRun run = collect(dir.path, statuses);
  INFO(run.describe());
  for (int status : statuses) {
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  check_matches_reference(run, DType::f64, /*world=*/4, /*steps=*/3, /*micro=*/1, /*min_buckets=*/4);
  // The ranks talked across the link, and only over the namespaces' addresses and loopback.
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const std::string peers = run.results[r].substr(run.results[r].find("peers"));
    CHECK(peers.find(kAddress[r < 2 ? 1 : 0]) != std::string::npos);
    std::istringstream words(peers.substr(5));
    for (std::string address; words >> address;) {
      CHECK((address == kAddress[0] || address == kAddress[1] || address == "127.0.0.1"));
    }
  }
  CHECK(hosts.processes_in(0).empty());
  CHECK(hosts.processes_in(1).empty());
}

TEST_CASE("Two nodes in network namespaces: a node lost to SIGKILL makes the other node fail within the timeout, "
          "naming the lost ranks; its launcher exits non-zero and leaves no process") {
  TwoHosts hosts;
  if (!require_hosts(hosts)) return;
  TempDir dir;
  const auto [a, b] = start_training_nodes(hosts, dir.path);
  const auto fault = Clock::now();
  hosts.kill_all(1);  // node B: its launcher and both workers
  const std::vector<int> statuses = wait_all({a, b}, 60);
  const double seconds = std::chrono::duration<double>(Clock::now() - fault).count();
  const WorkerRun run = collect(dir.path, statuses);
  INFO(run.describe());
  CHECK(exited_with_failure(statuses[0]));
  CHECK(seconds < 30);  // a closed connection fails at once: the 5 s naming grace, not the 30 s timeout
  check_survivors(run, 30000);
  CHECK(run.logs[0].find("worker rank") != std::string::npos);  // the launcher saw its worker fail
  CHECK(hosts.processes_in(0).empty());
  CHECK(hosts.processes_in(1).empty());
}

TEST_CASE("Two nodes in network namespaces: a node whose link goes down makes the other node fail at the 30 s "
          "timeout, naming the lost ranks; both launchers exit non-zero within 60 s and leave no process") {
  TwoHosts hosts;
  if (!require_hosts(hosts)) return;
  TempDir dir;
  const auto [a, b] = start_training_nodes(hosts, dir.path);
  const auto fault = Clock::now();
  REQUIRE(hosts.set_link(1, false));  // no FIN, no RST: only the timeout can tell
  const std::vector<int> statuses = wait_all({a, b}, 60);
  const double seconds = std::chrono::duration<double>(Clock::now() - fault).count();
  const WorkerRun run = collect(dir.path, statuses);
  INFO(run.describe());
  CHECK(exited_with_failure(statuses[0]));
  CHECK(exited_with_failure(statuses[1]));
  CHECK(seconds < 60);
  CHECK(seconds >= 29);  // nothing but the timeout ended the wait
  // The collective fails at the timeout; naming the silent ranks takes at most the 5 s grace more.
  check_survivors(run, 30000 + 5000 + 3000);
  CHECK(hosts.processes_in(0).empty());
  CHECK(hosts.processes_in(1).empty());
}
