// Distributed: TCPStore, ProcessGroup (Gloo on loopback), DDP and kiln-run.
//
// Multi-process cases fork+exec this test binary itself, running only the
// skipped test case "distributed_worker_entry" (selected with --no-skip); the
// worker reads its scenario from KILN_DIST_SCENARIO and writes its result to
// $KILN_DIST_OUT/rank<R>.txt ("OK ...", numbers, or "ERROR <ms> <message>").
// The parent hosts the store on a free port (as kiln-run does) unless a case
// tests rank 0 hosting it. Every wait is bounded; workers run with
// OMP_NUM_THREADS=1 so that 3 processes stay quick on a loaded 2-core machine.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "core/distributed/process_group.h"
#include "core/generator.h"
#include "kernels/cuda/runtime.h"
#include "nn/ddp.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "optim/optimizer.h"
#include "tests/support/ddp_reference.h"
#include "tests/support/test_util.h"
#include "tests/test_distributed_util.h"

using namespace kiln;
using namespace kiln::distributed;
using namespace kiln::testing::dist;
using namespace kiln::testing::ddp_reference;

namespace {

// ---------------------------------------------------------------- worker side

std::string env_string(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void write_result(const std::string& text) {
  const std::string dir = env_string("KILN_DIST_OUT");
  const std::string path = dir + "/rank" + env_string("RANK", "0") + ".txt";
  {
    std::ofstream out(path + ".tmp");
    out << text;
  }
  fs::rename(path + ".tmp", path);
}

void expect_values(const Tensor& t, const std::vector<double>& expected, const std::string& what) {
  const auto got = t.to(DType::f64).to_vector<double>();
  WORKER_EXPECT(got.size() == expected.size(), what, ": ", got.size(), " values");
  for (size_t i = 0; i < got.size(); ++i)
    WORKER_EXPECT(std::abs(got[i] - expected[i]) <= 1e-6 * (1 + std::abs(expected[i])), what, "[", i, "] = ", got[i],
                  ", expected ", expected[i]);
}

void scenario_collectives(const std::shared_ptr<ProcessGroup>& group) {
  ProcessGroup& pg = *group;
  const int r = pg.rank(), w = pg.size();
  const int64_t n = 6;
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      if (op == ReduceOp::avg && !is_floating(dtype)) continue;
      Tensor t = arange(1, n + 1, 1, {.dtype = DType::f64}).mul_(r + 1).to(dtype);
      pg.all_reduce(t, op)->wait();
      std::vector<double> expected;
      for (int64_t i = 1; i <= n; ++i) {
        const double sum = i * w * (w + 1) / 2.0;
        expected.push_back(op == ReduceOp::sum ? sum : op == ReduceOp::avg ? sum / w : op == ReduceOp::max ? i * w : i);
      }
      expect_values(t, expected, std::string("all_reduce ") + reduce_op_name(op) + " " + std::string(dtype_name(dtype)));
    }
  }
  Tensor b = arange(0, 4, 1, {.dtype = DType::f32}).add_(full({4}, 10.0 * r));
  pg.broadcast(b, w - 1)->wait();
  expect_values(b, {10.0 * (w - 1), 10.0 * (w - 1) + 1, 10.0 * (w - 1) + 2, 10.0 * (w - 1) + 3}, "broadcast");
  Tensor in = arange(0, 3, 1, {.dtype = DType::i64}).add_(full({3}, 100.0 * r, {.dtype = DType::i64}));
  Tensor gathered = zeros({w, 3}, {.dtype = DType::i64});
  pg.all_gather(gathered, in)->wait();
  std::vector<double> expected_gather;
  for (int k = 0; k < w; ++k)
    for (int i = 0; i < 3; ++i) expected_gather.push_back(100.0 * k + i);
  expect_values(gathered, expected_gather, "all_gather");
  Tensor rs_in = arange(0, 2 * w, 1, {.dtype = DType::f64}).add_(full({2 * w}, r, {.dtype = DType::f64}));
  Tensor rs_out = zeros({2}, {.dtype = DType::f64});
  pg.reduce_scatter(rs_out, rs_in, ReduceOp::sum)->wait();
  const double base = w * (w - 1) / 2.0;
  expect_values(rs_out, {base + w * (2.0 * r), base + w * (2.0 * r + 1)}, "reduce_scatter");
  expect_values(rs_in, arange(0, 2 * w, 1, {.dtype = DType::f64}).add_(full({2 * w}, r, {.dtype = DType::f64}))
                           .to_vector<double>(), "reduce_scatter leaves its input");
  // Several collectives in flight, waited in reverse; a large one (several Gloo segments).
  std::vector<Tensor> many;
  std::vector<WorkHandle> works;
  for (int k = 0; k < 5; ++k) {
    many.push_back(full({1000 + k}, k + r, {.dtype = DType::f32}));
    works.push_back(pg.all_reduce(many.back()));
  }
  Tensor large = full({1 << 20}, r + 1.0);
  works.push_back(pg.all_reduce(large, ReduceOp::avg));
  for (size_t k = works.size(); k-- > 0;) works[k]->wait();
  for (int k = 0; k < 5; ++k) expect_values(many[k].narrow(0, 0, 2), {k * w + base, k * w + base}, "async");
  WORKER_EXPECT(works[0]->is_completed());
  expect_values(large.narrow(0, (1 << 20) - 2, 2), {(w + 1) / 2.0, (w + 1) / 2.0}, "large all_reduce");
  Tensor empty_tensor = zeros({0});
  pg.all_reduce(empty_tensor)->wait();
  pg.barrier()->wait();
  // Argument errors are caught before any communication.
  expect_throw([&] { pg.all_reduce(zeros({3, 4}).t()); }, "contiguous");
  expect_throw([&] { pg.all_reduce(zeros({3}, {.dtype = DType::i64}), ReduceOp::avg); }, "floating");
  expect_throw([&] { pg.all_gather(zeros({5}), zeros({3})); }, "elements");
  expect_throw([&] { pg.broadcast(zeros({3}), w); }, "root");
  write_result("OK");
}

// DDP training: each rank takes its rows of the global batch; writes its parameters.
void scenario_ddp(const std::shared_ptr<ProcessGroup>& group) {
  ProcessGroup& pg = *group;
  const DType dtype = env_string("KILN_DIST_DTYPE") == "f32" ? DType::f32 : DType::f64;
  const int steps = std::stoi(env_string("KILN_DIST_STEPS", "3"));
  const int micro = std::stoi(env_string("KILN_DIST_MICRO", "1"));
  const int64_t rows = 2;  // per rank and micro-batch
  const int64_t total = rows * micro * pg.size();
  const bool sync_bn = env_string("KILN_DIST_NORM") == "sync";
  // Ranks start apart; DDP broadcasts rank 0's parameters.
  auto model = make_model(1234 + pg.rank(), dtype, sync_bn, sync_bn ? group : nullptr);
  nn::DDPOptions options;
  options.bucket_cap_mb = std::stod(env_string("KILN_DIST_BUCKET_MB", "25"));
  nn::DistributedDataParallel ddp(model, group, options);
  auto sgd = make_sgd(ddp);
  nn::MSELoss mse;
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = batch(step, (pg.rank() * micro + m) * rows, rows, total, dtype);
      if (m + 1 < micro) {
        auto guard = ddp.no_sync();
        (mse(ddp(x), y) * (1.0 / micro)).backward();
        WORKER_EXPECT(!ddp.gradient_sync_pending());
      } else {
        Tensor loss = mse(ddp(x), y);
        if (micro > 1) loss = loss * (1.0 / micro);
        loss.backward();
      }
    }
    WORKER_EXPECT(ddp.gradient_sync_pending());
    ddp.finish_gradient_sync();
    sgd->step();
    sgd->zero_grad();
  }
  write_result("buckets " + std::to_string(ddp.bucket_parameter_names().size()) + "\n" + param_values(*model));
}

// Two branches: rank 0 uses a and b, the others only a; c is never used.
struct Branches : nn::Module {
  std::shared_ptr<nn::Linear> a, b, c;
  Branches() {
    a = register_module("a", std::make_shared<nn::Linear>(kIn, kOut));
    b = register_module("b", std::make_shared<nn::Linear>(kIn, kOut));
    c = register_module("c", std::make_shared<nn::Linear>(kIn, kOut));
  }
  std::string type_name() const override { return "Branches"; }
};

void scenario_unused(const std::shared_ptr<ProcessGroup>& group) {
  const int r = group->rank();
  auto [x, y] = batch(0, 0, 4, 4, DType::f64);
  nn::MSELoss mse;
  std::string out;
  {
    // Without find_unused_parameters: an error naming the parameters.
    manual_seed(7);
    auto model = std::make_shared<Branches>();
    model->to(DType::f64);
    nn::DistributedDataParallel ddp(model, group);
    mse(model->a->forward(x), y).backward();
    expect_throw([&] { ddp.finish_gradient_sync(); }, "'b.weight'");
    expect_throw([&] { ddp.finish_gradient_sync(); }, "find_unused_parameters");
    out += "error_named ";
  }
  manual_seed(7);
  auto model = std::make_shared<Branches>();
  model->to(DType::f64);
  nn::DDPOptions options;
  options.find_unused_parameters = true;
  nn::DistributedDataParallel ddp(model, group, options);
  Tensor prediction = model->a->forward(x);
  if (r == 0) prediction = prediction + model->b->forward(x);
  mse(prediction, y).backward();
  std::vector<double> local_b;
  if (r == 0) local_b = model->b->weight.grad().to_vector<double>();
  ddp.finish_gradient_sync();
  WORKER_EXPECT(!model->c->weight.grad().defined(), "c was used by no rank: its .grad must stay undefined");
  WORKER_EXPECT(model->b->weight.grad().defined());
  std::ostringstream text;
  text.precision(17);
  text << out << "\nb_grad ";
  for (double v : model->b->weight.grad().to_vector<double>()) text << v << ' ';
  text << "\nlocal_b ";
  for (double v : local_b) text << v << ' ';
  write_result(text.str());
}

// Rank 2 dies in step 1 of DDP training; the survivors must get an error.
void scenario_killed_peer(const std::shared_ptr<ProcessGroup>& group) {
  auto model = make_model(1, DType::f32);
  nn::DistributedDataParallel ddp(model, group);
  auto sgd = make_sgd(ddp);
  nn::MSELoss mse;
  for (int step = 0; step < 3; ++step) {
    if (step == 1 && group->rank() == 2) ::raise(SIGKILL);
    auto [x, y] = batch(step, group->rank() * 2, 2, 2 * group->size(), DType::f32);
    const auto start = Clock::now();
    try {
      mse(ddp(x), y).backward();
      ddp.finish_gradient_sync();
    } catch (const Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      write_result("ERROR " + std::to_string(ms) + " step " + std::to_string(step) + " " + e.what());
      return;
    }
    sgd->step();
    sgd->zero_grad();
  }
  write_result("OK no error");
}

// Rank 1 arrives late at an all_reduce; rank 0 must time out.
void scenario_hung_peer(const std::shared_ptr<ProcessGroup>& group) {
  group->barrier()->wait();
  if (group->rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
  const auto start = Clock::now();
  try {
    group->all_reduce(ones({8}))->wait();
  } catch (const Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::string message = e.what();
    // A later call on the broken group throws at once.
    try {
      group->all_reduce(ones({8}))->wait();
      message += " [second call did not throw]";
    } catch (const Error& again) {
      if (std::string(again.what()).find("unusable") == std::string::npos) message += " [second call: other error]";
    }
    write_result("ERROR " + std::to_string(ms) + " " + message);
    return;
  }
  write_result("OK no error");
}

// Under kiln-run: 6 steps, progress saved after each; rank 1 crashes once at
// step 3; after the restart every rank resumes from the agreed progress.
void scenario_restart(const std::shared_ptr<ProcessGroup>& group) {
  const std::string dir = env_string("KILN_DIST_OUT");
  const std::string progress_path = dir + "/progress" + std::to_string(group->rank()) + ".txt";
  int64_t done = 0;
  if (std::ifstream in(progress_path); in) in >> done;
  Tensor resume = full({1}, static_cast<double>(done), {.dtype = DType::i64});
  group->all_reduce(resume, ReduceOp::min)->wait();
  const int64_t first = resume.item<int64_t>();
  for (int64_t step = first; step < 6; ++step) {
    if (step == 3 && group->rank() == 1 && !fs::exists(dir + "/crashed")) {
      std::ofstream(dir + "/crashed") << "1";
      std::printf("rank 1 crashing at step %lld\n", static_cast<long long>(step));
      std::fflush(stdout);
      ::_exit(3);
    }
    Tensor t = full({4}, static_cast<double>(step));
    group->all_reduce(t)->wait();
    WORKER_EXPECT(t.to_vector<float>()[0] == static_cast<float>(step * group->size()));
    std::ofstream(progress_path + ".tmp") << step + 1;  // atomic: a kill never leaves it empty
    fs::rename(progress_path + ".tmp", progress_path);
    std::printf("step %lld done\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
  write_result("DONE resumed_from " + std::to_string(first) + " restart " +
               env_string("TORCHELASTIC_RESTART_COUNT", "?"));
}

// Under kiln-run without restarts: rank 1 fails at once; rank 0 would sleep
// for a minute unless the launcher stops it.
void scenario_fail(const std::shared_ptr<ProcessGroup>& group) {
  group->barrier()->wait();
  if (group->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 is asleep by then
    ::_exit(3);
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  write_result("OK not stopped");
}

// A second init_process_group in the same process and restart round (after a
// destroy), with the launcher's store still holding the first group's keys.
std::shared_ptr<ProcessGroup> scenario_reinit(std::shared_ptr<ProcessGroup> group) {
  for (int generation = 0; generation < 2; ++generation) {
    Tensor t = full({4}, static_cast<double>(group->rank() + 1) * (generation + 1));
    group->all_reduce(t, ReduceOp::sum)->wait();
    const double w = group->size();
    expect_values(t, std::vector<double>(4, w * (w + 1) / 2 * (generation + 1)),
                  "all_reduce of group " + std::to_string(generation));
    if (generation == 0) {
      destroy_process_group();
      group = init_process_group();
    }
  }
  write_result("OK");
  return group;
}

}  // namespace

TEST_CASE("distributed_worker_entry" * doctest::skip()) {
  const std::string scenario = env_string("KILN_DIST_SCENARIO");
  if (scenario.empty()) return;
  try {
    auto group = init_process_group();
    if (scenario == "collectives") scenario_collectives(group);
    else if (scenario == "ddp") scenario_ddp(group);
    else if (scenario == "unused") scenario_unused(group);
    else if (scenario == "killed_peer") scenario_killed_peer(group);
    else if (scenario == "hung_peer") scenario_hung_peer(group);
    else if (scenario == "restart") scenario_restart(group);
    else if (scenario == "fail") scenario_fail(group);
    else if (scenario == "reinit") group = scenario_reinit(group);
    else KILN_THROW("unknown scenario ", scenario);
    destroy_process_group();
  } catch (const std::exception& e) {
    write_result(std::string("ERROR 0 ") + e.what());
  }
}

// ---------------------------------------------------------------- parent side

namespace {

// Runs `world` workers of `scenario`. The parent hosts the store (as kiln-run
// does) unless rank0_hosts_store.
WorkerRun run_workers(const std::string& scenario, int world, std::map<std::string, std::string> env,
                      bool rank0_hosts_store = false, double deadline_s = 40) {
  TempDir dir;
  std::unique_ptr<TCPStore> store;
  int port = 0;
  if (rank0_hosts_store) {
    port = free_port();
  } else {
    store = std::make_unique<TCPStore>("127.0.0.1", 0, true);
    port = store->port();
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  }
  env["KILN_DIST_SCENARIO"] = scenario;
  env["KILN_DIST_OUT"] = dir.path.string();
  env["WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(port);
  env["OMP_NUM_THREADS"] = "1";
  if (!env.count("KILN_DIST_TIMEOUT")) env["KILN_DIST_TIMEOUT"] = "30";
  const auto start = Clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    pids.push_back(spawn(worker_command(), env, dir.path / ("rank" + std::to_string(r) + ".log")));
  }
  WorkerRun run;
  run.statuses = wait_all(pids, deadline_s);
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < world; ++r) {
    run.results.push_back(read_file(dir.path / ("rank" + std::to_string(r) + ".txt")));
    run.logs.push_back(read_file(dir.path / ("rank" + std::to_string(r) + ".log")));
  }
  return run;
}

}  // namespace

TEST_CASE("TCPStore: set, get, add, check and wait, with timeouts") {
  TCPStore server("127.0.0.1", 0, true, std::chrono::milliseconds(2000));
  REQUIRE(server.port() > 0);
  TCPStore client("127.0.0.1", server.port(), false, std::chrono::milliseconds(300));
  client.set("a", std::string("hello"));
  CHECK(server.get_string("a") == "hello");
  CHECK(server.check({"a"}));
  CHECK_FALSE(server.check({"a", "b"}));
  CHECK(client.add("counter", 2) == 2);
  CHECK(server.add("counter", 5) == 7);
  // A get that waits for a key set later by another client.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server.set("late", std::string("x"));
  });
  CHECK(client.get_string("late") == "x");
  setter.join();
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(client.wait({"never"}), doctest::Contains("timed out after 300 ms"), Error);
  CHECK_THROWS_WITH_AS(client.get("never"), doctest::Contains("'never'"), Error);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5);
}

TEST_CASE("TCPStore: a client finds no server within its timeout") {
  const int port = free_port();
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(TCPStore("127.0.0.1", port, false, std::chrono::milliseconds(300)),
                       doctest::Contains("could not connect"), Error);
  CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5);
}

TEST_CASE("distributed environment: missing variables are named") {
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"}) {
    const char* v = std::getenv(name);
    saved[name] = v ? std::optional<std::string>(v) : std::nullopt;
    ::unsetenv(name);
  }
  CHECK_FALSE(launched_distributed());
  CHECK_THROWS_WITH_AS(read_torchrun_env(), doctest::Contains("RANK"), Error);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK_THROWS_WITH_AS(read_torchrun_env(), doctest::Contains("MASTER_ADDR"), Error);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "x", 1);
  CHECK_THROWS_WITH_AS(read_torchrun_env(), doctest::Contains("MASTER_PORT"), Error);
  ::setenv("MASTER_PORT", "29511", 1);
  const DistributedEnv env = read_torchrun_env();
  CHECK(env.rank == 1);
  CHECK(env.world_size == 2);
  CHECK(env.local_rank == 1);
  CHECK(env.master_port == 29511);
  ::setenv("RANK", "2", 1);
  CHECK_THROWS_WITH_AS(read_torchrun_env(), doctest::Contains("not in [0, WORLD_SIZE=2)"), Error);
  for (const auto& [name, value] : saved) {
    if (value) ::setenv(name.c_str(), value->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
}

TEST_CASE("ProcessGroup: collectives over Gloo with 2 and 3 processes") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const WorkerRun run = run_workers("collectives", world, {});
    INFO(run.describe());
    for (int r = 0; r < world; ++r) CHECK(run.results[r] == "OK");
  }
}

TEST_CASE("ProcessGroup: destroyed and made again in one process and restart round, under the launcher's store") {
  const WorkerRun run = run_workers("reinit", 2, {});
  INFO(run.describe());
  for (int r = 0; r < 2; ++r) CHECK(run.results[r] == "OK");
}

TEST_CASE("DDP: parameters equal single-process training on the concatenated batch") {
  SUBCASE("float64, 2 processes, rank 0 hosts the store, buckets of one parameter") {
    const WorkerRun run = run_workers("ddp", 2, {{"KILN_DIST_DTYPE", "f64"}, {"KILN_DIST_BUCKET_MB", "0.0001"}}, true);
    check_matches_reference(run, DType::f64, 2, 3, 1, 4);
  }
  SUBCASE("float64, 3 processes") {
    const WorkerRun run = run_workers("ddp", 3, {{"KILN_DIST_DTYPE", "f64"}, {"KILN_DIST_BUCKET_MB", "0.0003"}});
    check_matches_reference(run, DType::f64, 3, 3, 1, 2);
  }
  SUBCASE("float32, 2 processes, one 25 MB bucket") {
    const WorkerRun run = run_workers("ddp", 2, {{"KILN_DIST_DTYPE", "f32"}});
    check_matches_reference(run, DType::f32, 2, 3, 1, 1);
  }
}

TEST_CASE("DDP: no_sync accumulation over 4 micro-batches equals one large batch") {
  const WorkerRun run = run_workers("ddp", 2, {{"KILN_DIST_DTYPE", "f64"}, {"KILN_DIST_MICRO", "4"},
                                               {"KILN_DIST_STEPS", "2"}, {"KILN_DIST_BUCKET_MB", "0.0001"}});
  check_matches_reference(run, DType::f64, 2, 2, 4, 4);
}

TEST_CASE("SyncBatchNorm: 2 and 3 processes match BatchNorm over the concatenated batch") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    const WorkerRun run = run_workers("ddp", world, {{"KILN_DIST_DTYPE", "f64"}, {"KILN_DIST_NORM", "sync"}});
    check_matches_reference(run, DType::f64, world, 3, 1, 1, /*batch_norm=*/true);
  }
}

TEST_CASE("DDP: a parameter without a gradient is named, or allowed with find_unused_parameters") {
  const WorkerRun run = run_workers("unused", 2, {});
  INFO(run.describe());
  for (int r = 0; r < 2; ++r) REQUIRE(run.results[r].rfind("error_named", 0) == 0);
  // b is used by rank 0 only: every rank ends with rank 0's gradient / 2.
  auto section = [](const std::string& text, const std::string& name) {
    const size_t at = text.find(name);
    return parse_numbers(text.substr(at + name.size(), text.find('\n', at) - at - name.size()));
  };
  const std::vector<double> local = section(run.results[0], "local_b");
  REQUIRE(local.size() == static_cast<size_t>(kIn * kOut));
  for (int r = 0; r < 2; ++r) {
    const std::vector<double> averaged = section(run.results[r], "b_grad");
    REQUIRE(averaged.size() == local.size());
    for (size_t i = 0; i < local.size(); ++i) CHECK(averaged[i] == doctest::Approx(local[i] / 2).epsilon(1e-12));
  }
}

TEST_CASE("Distributed: a killed peer makes the survivors fail within the timeout") {
  const WorkerRun run = run_workers("killed_peer", 3, {{"KILN_DIST_TIMEOUT", "10"}});
  INFO(run.describe());
  CHECK(WIFSIGNALED(run.statuses[2]));
  for (int r = 0; r < 2; ++r) {
    REQUIRE(run.results[r].rfind("ERROR ", 0) == 0);
    const double ms = parse_numbers(run.results[r].substr(0, 20)).at(0);
    CHECK(ms < 10000 + 3000);
    CHECK(run.results[r].find("step 1") != std::string::npos);
    CHECK(run.results[r].find("Gloo") != std::string::npos);
    CHECK(run.results[r].find("rank 2 stopped answering") != std::string::npos);  // the survivors tell who
  }
  CHECK(run.seconds < 25);
}

TEST_CASE("Distributed: a hung peer turns into a timeout error") {
  const WorkerRun run = run_workers("hung_peer", 2, {{"KILN_DIST_TIMEOUT", "1.5"}});
  INFO(run.describe());
  REQUIRE(run.results[0].rfind("ERROR ", 0) == 0);
  const double ms = parse_numbers(run.results[0].substr(0, 20)).at(0);
  CHECK(ms >= 1000);
  CHECK(ms < 1500 + 2500);
  CHECK(run.results[0].find("1500 ms") != std::string::npos);
  // Rank 1 lives (it sleeps): not named as gone.
  CHECK(run.results[0].find("alive, but not done with this collective: rank(s) 1") != std::string::npos);
  CHECK(run.results[0].find("second call") == std::string::npos);
}

TEST_CASE("Distributed: NCCL with one rank on one GPU (collectives and DDP) [gpu]") {
  KILN_REQUIRE_GPU();
  auto store = std::make_shared<TCPStore>("127.0.0.1", 0, true);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  auto group = std::make_shared<ProcessGroup>(store, 0, 1, options, "gpu_test/");
  const Device gpu = Device::cuda(0);
  const Tensor values = arange(0, 8, 1, {.dtype = DType::f32});
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    // Computed on the current stream right before: the collective must be ordered after it.
    Tensor t = (values.to(gpu) * 2.0) * 0.5;
    group->all_reduce(t, op)->wait();
    KILN_CHECK_CLOSE(t.cpu(), values, 0, 0);
  }
  Tensor b = values.to(gpu);
  group->broadcast(b, 0)->wait();
  KILN_CHECK_CLOSE(b.cpu(), values, 0, 0);
  Tensor gathered = zeros({8}, {.device = gpu});
  group->all_gather(gathered, values.to(gpu))->wait();
  KILN_CHECK_CLOSE(gathered.cpu(), values, 0, 0);
  Tensor scattered = zeros({8}, {.device = gpu});
  group->reduce_scatter(scattered, values.to(gpu), ReduceOp::sum)->wait();
  KILN_CHECK_CLOSE(scattered.cpu(), values, 0, 0);
  // DDP on the GPU (float64) against the single-process CPU reference.
  auto model = make_model(1234, DType::f64);
  model->to(gpu);
  nn::DistributedDataParallel ddp(model, group);
  auto sgd = make_sgd(ddp);
  nn::MSELoss mse;
  for (int step = 0; step < 3; ++step) {
    auto [x, y] = batch(step, 0, 2, 2, DType::f64);
    mse(ddp(x.to(gpu)), y.to(gpu)).backward();
    ddp.finish_gradient_sync();
    sgd->step();
    sgd->zero_grad();
  }
  const std::vector<double> expected = reference_params(DType::f64, 1, 3, 1);
  const std::vector<double> got = parse_numbers(param_values(*model));
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-9));
}
