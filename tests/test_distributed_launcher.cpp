// kiln-run (examples/kiln-run.cpp): restarts a failed run, which resumes from
// its progress file; a failed worker stops the others. The workers are this
// test binary's "distributed_worker_entry" (tests/test_distributed.cpp).
#include <doctest/doctest.h>

#include "tests/test_distributed_util.h"

using namespace kiln::testing::dist;

namespace {

std::vector<std::string> launcher_command(const std::vector<std::string>& flags) {
  const fs::path launcher = fs::path(self_exe()).parent_path() / "kiln-run";
  REQUIRE_MESSAGE(fs::exists(launcher), "kiln-run not found next to kiln_tests: build the kiln-run target");
  std::vector<std::string> argv = {launcher.string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--");
  for (const auto& arg : worker_command()) argv.push_back(arg);
  return argv;
}

}  // namespace

TEST_CASE("kiln-run: restarts a failed run, which resumes from its progress file and finishes") {
  TempDir dir;
  const auto argv = launcher_command({"--nproc-per-node", "2", "--master-port", "0", "--max-restarts", "1"});
  const pid_t pid = spawn(argv,
                          {{"KILN_DIST_SCENARIO", "restart"}, {"KILN_DIST_OUT", dir.path.string()},
                           {"KILN_DIST_TIMEOUT", "20"}, {"OMP_NUM_THREADS", "1"}},
                          dir.path / "launcher.log");
  const int status = wait_all({pid}, 50).at(0);
  const std::string log = read_file(dir.path / "launcher.log");
  INFO(log);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Steps 0-1 finished on both ranks and step 2 on rank 1 before it crashed
  // at step 3; rank 0 may be stopped before saving step 2. The ranks agree on
  // where to resume: after step 1 or 2, not from scratch.
  const std::string rank0 = read_file(dir.path / "rank0.txt");
  CHECK((rank0 == "DONE resumed_from 2 restart 1" || rank0 == "DONE resumed_from 3 restart 1"));
  CHECK(read_file(dir.path / "rank1.txt") == rank0);
  CHECK(log.find("[rank 1] rank 1 crashing at step 3") != std::string::npos);
  CHECK(log.find("[rank 0] step 5 done") != std::string::npos);
  CHECK(log.find("[rank 1] step 5 done") != std::string::npos);
  CHECK(log.find("restarting all workers (restart 1 of 1)") != std::string::npos);
}

TEST_CASE("kiln-run: a failed worker stops the others and its exit code is returned") {
  TempDir dir;
  const auto argv = launcher_command({"--nproc-per-node", "2", "--master-port", "0"});
  const auto start = Clock::now();
  const pid_t pid = spawn(argv,
                          {{"KILN_DIST_SCENARIO", "fail"}, {"KILN_DIST_OUT", dir.path.string()},
                           {"KILN_DIST_TIMEOUT", "20"}, {"OMP_NUM_THREADS", "1"}},
                          dir.path / "launcher.log");
  const int status = wait_all({pid}, 40).at(0);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string log = read_file(dir.path / "launcher.log");
  INFO(log);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK(seconds < 20);  // rank 0 sleeps 60 s unless stopped
  CHECK_FALSE(fs::exists(dir.path / "rank0.txt"));
  CHECK(log.find("worker rank 1") != std::string::npos);
  CHECK(log.find("exited with code 3") != std::string::npos);
}

TEST_CASE("kiln-run: forwards SIGTERM to every worker") {
  TempDir dir;
  const fs::path launcher = fs::path(self_exe()).parent_path() / "kiln-run";
  REQUIRE_MESSAGE(fs::exists(launcher), "kiln-run not found next to kiln_tests: build the kiln-run target");
  const std::vector<std::string> argv = {
      launcher.string(), "--nproc-per-node", "2", "--master-port", "0", "--", "/bin/sh", "-c",
      "trap 'echo got TERM; exit 7' TERM; echo ready; while :; do sleep 0.05; done"};
  const fs::path log_path = dir.path / "launcher.log";
  const pid_t pid = spawn(argv, {}, log_path);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::string log;
  while (Clock::now() < deadline) {
    log = read_file(log_path);
    if (log.find("[rank 0] ready") != std::string::npos && log.find("[rank 1] ready") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGTERM);
  const int status = wait_all({pid}, 20).at(0);
  log = read_file(log_path);
  INFO(log);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 128 + SIGTERM);
  CHECK(log.find("[rank 0] got TERM") != std::string::npos);
  CHECK(log.find("[rank 1] got TERM") != std::string::npos);
}
