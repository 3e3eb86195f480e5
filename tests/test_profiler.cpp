// Profilers: SimpleProfiler's counts, durations and Lightning's table; the op
// profiler's counts of a small forward/backward (autograd-node granularity,
// core/profiler.h); RecordFunction ranges; NVTX scopes; the Trainer's names.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/profiler.h"
#include "tests/support/test_util.h"
#include "trainer/profiler.h"

namespace fs = std::filesystem;
using doctest::Contains;
using namespace kiln;

namespace {

void sleep_ms(int milliseconds) { std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds)); }

const ActionStats& find_action(const std::vector<ActionStats>& stats, const std::string& name) {
  for (const ActionStats& action : stats) {
    if (action.name == name) return action;
  }
  FAIL("no action " << name);
  return stats.front();
}

const OpStats* find_op(const std::vector<OpStats>& stats, const std::string& name) {
  for (const OpStats& op : stats) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

// `steps` forward/backward passes of a two-layer MLP: per pass, 2 matmul,
// 1 relu, 1 mean nodes, and one AccumulateGrad per weight.
void train_mlp(int steps, Device device = Device::cpu()) {
  const TensorOptions options{.device = device};
  Tensor x = randn({8, 4}, options);
  Tensor w1 = randn({4, 16}, options).requires_grad_(true);
  Tensor w2 = randn({16, 1}, options).requires_grad_(true);
  for (int step = 0; step < steps; ++step) {
    RecordFunction range("forward_backward", device);
    Tensor loss = mean(matmul(relu(matmul(x, w1)), w2));
    loss.backward();
  }
}

}  // namespace

TEST_CASE("SimpleProfiler counts calls and orders durations as the sleeps") {
  SimpleProfiler profiler;
  for (int i = 0; i < 3; ++i) {
    auto scope = profiler.profile("short");
    sleep_ms(2);
  }
  for (int i = 0; i < 2; ++i) {
    auto scope = profiler.profile("long");
    sleep_ms(20);
  }
  const std::vector<ActionStats> stats = profiler.stats();
  REQUIRE(stats.size() == 2);
  CHECK(stats[0].name == "long");  // sorted by total time
  const ActionStats& short_action = find_action(stats, "short");
  const ActionStats& long_action = find_action(stats, "long");
  CHECK(short_action.calls == 3);
  CHECK(long_action.calls == 2);
  CHECK(short_action.mean_seconds() >= 0.002);
  CHECK(long_action.mean_seconds() >= 0.020);
  CHECK(long_action.mean_seconds() > short_action.mean_seconds());
  CHECK(long_action.total_seconds > short_action.total_seconds);
}

TEST_CASE("SimpleProfiler refuses to start a running action or stop one never started") {
  SimpleProfiler profiler;
  profiler.start("a");
  CHECK_THROWS_WITH(profiler.start("a"), Contains("already started"));
  CHECK_THROWS_WITH(profiler.stop("b"), Contains("never started"));
  profiler.stop("a");
  CHECK_THROWS_WITH(profiler.stop("a"), Contains("never started"));
}

TEST_CASE("SimpleProfiler prints Lightning's table, sorted by total time") {
  SimpleProfiler profiler;
  profiler.setup("fit", "");
  for (int i = 0; i < 2; ++i) {
    auto epoch = profiler.profile("run_training_epoch");
    for (int j = 0; j < 3; ++j) {
      auto batch = profiler.profile("run_training_batch");
      sleep_ms(1);
    }
  }
  const std::string report = profiler.summary();
  INFO(report);
  std::istringstream lines(report);
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  REQUIRE(rows.size() == 10);
  CHECK(rows[0] == "FIT Profiler Report");
  CHECK(rows[1].empty());
  // The rule is one longer than the tab-expanded header, as Lightning's is.
  const std::string header = "|  Action            \t|  Mean duration (s)\t|  Num calls      \t|  Total time (s) \t|  "
                             "Percentage %   \t|";
  CHECK(rows[3] == header);
  CHECK(rows[2] == std::string(122, '-'));
  CHECK(rows[4] == rows[2]);
  CHECK(rows[5].rfind("|  Total             \t|  -              \t|  8              \t|  ", 0) == 0);
  CHECK(rows[7].rfind("|  run_training_epoch\t|", 0) == 0);
  CHECK(rows[8].rfind("|  run_training_batch\t|", 0) == 0);
  CHECK(rows[8].find("|  6              \t|") != std::string::npos);
  CHECK(rows[9] == rows[2]);
}

TEST_CASE("Profiler::describe appends to <dirpath>/<stage>-<filename>.txt") {
  const fs::path folder = fs::temp_directory_path() / ("kiln_profiler_" + std::to_string(::getpid()));
  fs::remove_all(folder);
  SimpleProfiler profiler("", "perf");
  profiler.setup("fit", folder.string());  // no dirpath: the log dir
  { auto scope = profiler.profile("optimizer_step"); }
  profiler.describe();
  profiler.describe();
  std::ifstream in(folder / "fit-perf.txt");
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("FIT Profiler Report") != std::string::npos);
  CHECK(text.str().find("FIT Profiler Report") != text.str().rfind("FIT Profiler Report"));  // appended twice
  CHECK(text.str().find("optimizer_step") != std::string::npos);
  fs::remove_all(folder);
}

TEST_CASE("make_profiler maps Lightning's names") {
  CHECK(dynamic_cast<PassThroughProfiler*>(make_profiler("").get()) != nullptr);
  CHECK(dynamic_cast<SimpleProfiler*>(make_profiler("simple").get()) != nullptr);
  CHECK(dynamic_cast<PyTorchProfiler*>(make_profiler("pytorch").get()) != nullptr);
  CHECK_THROWS_WITH(make_profiler("advanced"), Contains("cProfile"));
  CHECK_THROWS_WITH(make_profiler("fancy"), Contains("unknown profiler 'fancy'"));
}

TEST_CASE("the op profiler counts the autograd nodes of a forward/backward") {
  constexpr int steps = 3;
  train_mlp(1);  // before start: not counted
  OpProfiler profiler;
  profiler.start();
  CHECK(active_op_profiler() == &profiler);
  train_mlp(steps);
  {
    NoGradGuard no_grad;  // ops without a node are not seen
    Tensor a = randn({4, 4});
    matmul(a, a);
  }
  profiler.stop();
  CHECK(active_op_profiler() == nullptr);
  train_mlp(1);  // after stop: not counted

  const std::vector<OpStats> stats = profiler.op_stats();
  INFO(profiler.table());
  const OpStats* matmul_stats = find_op(stats, "matmul");
  REQUIRE(matmul_stats != nullptr);
  CHECK(matmul_stats->forward_calls == 2 * steps);
  CHECK(matmul_stats->backward_calls == 2 * steps);
  CHECK(matmul_stats->backward_cpu_seconds > 0);
  CHECK(matmul_stats->backward_cuda_seconds == 0);
  REQUIRE(find_op(stats, "relu") != nullptr);
  CHECK(find_op(stats, "relu")->forward_calls == steps);
  CHECK(find_op(stats, "relu")->backward_calls == steps);
  REQUIRE(find_op(stats, "mean") != nullptr);
  CHECK(find_op(stats, "mean")->backward_calls == steps);
  REQUIRE(find_op(stats, "AccumulateGrad") != nullptr);
  CHECK(find_op(stats, "AccumulateGrad")->forward_calls == 0);
  CHECK(find_op(stats, "AccumulateGrad")->backward_calls == 2 * steps);  // w1 and w2
  for (size_t i = 1; i < stats.size(); ++i) CHECK(stats[i - 1].backward_cpu_seconds >= stats[i].backward_cpu_seconds);

  const std::vector<RangeStats> ranges = profiler.range_stats();
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].name == "forward_backward");
  CHECK(ranges[0].calls == steps);
  double backward_total = 0;
  for (const OpStats& op : stats) backward_total += op.backward_cpu_seconds;
  CHECK(ranges[0].cpu_seconds >= backward_total);  // the ranges enclose every backward

  const std::string table = profiler.table();
  CHECK(table.find("Op (autograd node)") != std::string::npos);
  CHECK(table.find("matmul") != std::string::npos);
  CHECK(table.find("forward_backward") != std::string::npos);
  CHECK(table.find("CUDA") == std::string::npos);  // no CUDA time, no CUDA columns
  profiler.reset();
  CHECK(profiler.op_stats().empty());
}

TEST_CASE("only one op profiler is active per thread") {
  OpProfiler first, second;
  first.start();
  CHECK_THROWS_WITH(second.start(), Contains("already active"));
  first.stop();
  second.start();
  CHECK(active_op_profiler() == &second);
  second.stop();
}

TEST_CASE("PyTorchProfiler records op statistics between setup and teardown, and actions as ranges") {
  PyTorchProfiler profiler;
  profiler.setup("fit", "");
  for (int i = 0; i < 2; ++i) {
    auto scope = profiler.profile("[LightningModule]MLP.training_step");
    train_mlp(1);
  }
  const std::string report = profiler.summary();
  INFO(report);
  const std::vector<OpStats> stats = profiler.op_profiler().op_stats();  // find_op points into it
  const OpStats* matmul_stats = find_op(stats, "matmul");
  REQUIRE(matmul_stats != nullptr);
  CHECK(matmul_stats->backward_calls == 4);
  CHECK(report.rfind("FIT Profiler Report (kiln op profiler)\n", 0) == 0);
  CHECK(report.find("[LightningModule]MLP.training_step") != std::string::npos);
  profiler.teardown();
  CHECK(active_op_profiler() == nullptr);
  // A new stage starts a new report.
  profiler.setup("test", "");
  CHECK(profiler.op_profiler().op_stats().empty());
  profiler.teardown();
}

TEST_CASE("the op profiler measures CUDA time from events [gpu]") {
  KILN_REQUIRE_GPU();
  OpProfiler profiler;
  profiler.start();
  train_mlp(2, Device::cuda(0));
  profiler.stop();
  const std::vector<OpStats> stats = profiler.op_stats();
  INFO(profiler.table());
  const OpStats* matmul_stats = find_op(stats, "matmul");
  REQUIRE(matmul_stats != nullptr);
  CHECK(matmul_stats->backward_calls == 4);
  CHECK(matmul_stats->backward_cuda_seconds > 0);
  CHECK(profiler.range_stats().at(0).cuda_seconds > 0);
  CHECK(profiler.table().find("Backward CUDA total") != std::string::npos);
}

TEST_CASE("NVTX ranges nest and pop without a tool attached") {
  // Without Nsight attached (or without CUDA) these must be harmless no-ops.
  NvtxRange outer("outer");
  { NvtxRange inner(std::string("inner")); }
  RecordFunction unprofiled("no profiler on");  // NVTX only
  CHECK(active_op_profiler() == nullptr);
}
