// ZeroRedundancyOptimizer (optim/zero.h) over Gloo on the CPU.
//
// Multi-process cases fork+exec this test binary running only the skipped
// case "zero_worker_entry" (see tests/test_distributed.cpp for the pattern):
// the worker reads KILN_ZERO_SCENARIO, trains a 4-layer float64 MLP under
// DistributedDataParallel on its rows of a fixed global batch, and writes
// "key value..." lines to $KILN_ZERO_OUT/rank<R>.txt (or "ERROR <message>").
// The parent hosts the store; every wait is bounded.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/distributed/process_group.h"
#include "core/generator.h"
#include "core/serialization.h"
#include "nn/ddp.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "optim/zero.h"
#include "tests/test_distributed_util.h"

using namespace kiln;
using namespace kiln::testing::dist;

namespace {

constexpr int64_t kWidth = 16, kLayers = 4, kRows = 6;  // 6 rows: split evenly over 1, 2 or 3 ranks

std::string env_string(const char* name, const char* fallback = "") {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

// kLayers x (Linear(16, 16), Tanh), float64: 4 weights of 256 and 4 biases of 16.
std::shared_ptr<nn::Sequential> make_model() {
  manual_seed(42);
  auto model = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < kLayers; ++i) {
    model->push_back(std::make_shared<nn::Linear>(kWidth, kWidth));
    model->push_back(std::make_shared<nn::Tanh>());
  }
  model->to(DType::f64);
  return model;
}

// Two groups, as a real recipe has: the weights, and the biases with their own lr and no decay.
std::vector<optim::ParamGroup> param_groups(const nn::Module& model) {
  optim::ParamGroup weights, biases;
  for (const auto& [name, p] : model.named_parameters()) {
    (name.find("bias") != std::string::npos ? biases : weights).params.push_back(p);
  }
  weights.weight_decay = 0.05;
  biases.lr = 0.02;
  return {weights, biases};
}

std::unique_ptr<optim::Optimizer> make_adam(std::vector<optim::ParamGroup> groups) {
  return std::make_unique<optim::AdamW>(std::move(groups), optim::AdamWOptions{});
}

// Rows [begin, begin + rows) of step `step`'s global batch: x, y (rows, 16).
std::pair<Tensor, Tensor> batch(int step, int64_t begin, int64_t rows) {
  std::mt19937_64 rng(500 + step);
  std::normal_distribution<double> normal;
  std::vector<double> x(kRows * kWidth), y(kRows * kWidth);
  for (auto& v : x) v = normal(rng);
  for (auto& v : y) v = normal(rng);
  auto slice = [&](const std::vector<double>& all) {
    return tensor(std::vector<double>(all.begin() + begin * kWidth, all.begin() + (begin + rows) * kWidth),
                  {rows, kWidth});
  };
  return {slice(x), slice(y)};
}

std::string values(const nn::Module& model) {
  std::ostringstream out;
  out.precision(17);
  for (const Tensor& p : model.parameters())
    for (double v : p.to_vector<double>()) out << v << ' ';
  return out.str();
}

size_t allocated_cpu_bytes() { return memory_stats(Device::cpu()).allocated_bytes; }

// ---------------------------------------------------------------- worker side

// One DDP step of `model` on this rank's rows of step `step`'s batch.
template <typename StepFn>
void train_step(nn::DistributedDataParallel& ddp, int step, const distributed::ProcessGroup& group, StepFn&& update) {
  const int64_t rows = kRows / group.size();
  auto [x, y] = batch(step, group.rank() * rows, rows);
  nn::MSELoss mse;
  mse(ddp(x), y).backward();
  ddp.finish_gradient_sync();
  update();
}

// Plain DDP + AdamW and DDP + ZeroRedundancyOptimizer(AdamW) side by side, 4 steps.
std::string scenario_parity(const std::shared_ptr<distributed::ProcessGroup>& group) {
  auto plain_model = make_model(), zero_model = make_model();
  nn::DistributedDataParallel plain_ddp(plain_model, group), zero_ddp(zero_model, group);
  auto plain = make_adam(param_groups(*plain_model));
  optim::ZeroRedundancyOptimizer zero(param_groups(*zero_model), make_adam, group);
  expect_throw([&] { (void)zero.state_dict(); }, "consolidate_state_dict");
  expect_throw([&] { optim::ZeroRedundancyOptimizer(std::vector<Tensor>{zero_model->parameters()[0]}, make_adam, group); },
               "would own none");
  size_t plain_bytes = 0, zero_bytes = 0;
  for (int step = 0; step < 4; ++step) {
    train_step(plain_ddp, step, *group, [&] {
      const size_t before = allocated_cpu_bytes();
      plain->step();
      if (step == 0) plain_bytes = allocated_cpu_bytes() - before;  // the state is made on the first step
      plain->zero_grad();
    });
    train_step(zero_ddp, step, *group, [&] {
      const size_t before = allocated_cpu_bytes();
      zero.step();
      if (step == 0) zero_bytes = allocated_cpu_bytes() - before;
      zero.zero_grad();
    });
  }
  double max_difference = 0;
  const auto a = plain_model->parameters(), b = zero_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    const auto u = a[i].to_vector<double>(), v = b[i].to_vector<double>();
    for (size_t k = 0; k < u.size(); ++k) max_difference = std::max(max_difference, std::abs(u[k] - v[k]));
  }
  std::ostringstream out;
  out << "plain_state_bytes " << plain_bytes << "\nzero_state_bytes " << zero_bytes << "\nmax_difference "
      << max_difference << "\nowned";
  for (int64_t index : zero.owned_params()) out << ' ' << index;
  out << "\nparams " << values(*zero_model) << "\n";
  return out.str();
}

// $KILN_ZERO_FILE: "model.<i>" parameters and "optimizer.<name>" state, the state's JSON in the metadata.
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::StateDict& state) {
  NamedTensorList tensors;
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) tensors.emplace_back("model." + std::to_string(i), params[i]);
  for (const auto& [name, t] : state.tensors) tensors.emplace_back("optimizer." + name, t);
  save_safetensors(path, tensors, {{"optimizer", state.meta.dump()}});
}

// Loads save_checkpoint's file into `model` and returns the optimizer state.
optim::StateDict load_checkpoint(const std::string& path, nn::Module& model) {
  const SafetensorsFile file = load_safetensors(path);
  optim::StateDict state;
  state.meta = nlohmann::json::parse(file.metadata.at("optimizer"));
  auto params = model.parameters();
  NoGradGuard no_grad;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) params.at(std::stoul(name.substr(6))).copy_(t);
    if (name.rfind("optimizer.", 0) == 0) state.tensors[name.substr(10)] = t;
  }
  return state;
}

// Steps [first, last) with ZeRO; with `save`, the full state is gathered on rank 0 and written there.
std::string scenario_checkpoint(const std::shared_ptr<distributed::ProcessGroup>& group, bool resume) {
  const std::string path = env_string("KILN_ZERO_FILE");
  auto model = make_model();
  optim::StateDict saved;
  if (resume) saved = load_checkpoint(path, *model);
  nn::DistributedDataParallel ddp(model, group);
  optim::ZeroRedundancyOptimizer zero(param_groups(*model), make_adam, group);
  if (resume) zero.load_state_dict(saved);
  for (int step = resume ? 3 : 0; step < (resume ? 6 : 3); ++step) {
    train_step(ddp, step, *group, [&] {
      zero.step();
      zero.zero_grad();
    });
  }
  if (!resume) {
    zero.consolidate_state_dict(0);
    if (group->rank() == 0) {
      save_checkpoint(path, *model, zero.state_dict());
    } else {
      expect_throw([&] { (void)zero.state_dict(); }, "consolidated on rank 0");
    }
    group->barrier()->wait();
  }
  return "params " + values(*model) + "\n";
}

}  // namespace

TEST_CASE("zero_worker_entry" * doctest::skip()) {
  const std::string scenario = env_string("KILN_ZERO_SCENARIO");
  if (scenario.empty()) return;
  std::string result;
  try {
    auto group = distributed::init_process_group();
    if (scenario == "parity") result = scenario_parity(group);
    else if (scenario == "save") result = scenario_checkpoint(group, false);
    else if (scenario == "resume") result = scenario_checkpoint(group, true);
    else KILN_THROW("unknown scenario ", scenario);
    distributed::destroy_process_group();
  } catch (const std::exception& e) {
    result = std::string("ERROR ") + e.what();
  }
  const std::string path = env_string("KILN_ZERO_OUT") + "/rank" + env_string("RANK", "0") + ".txt";
  std::ofstream(path + ".tmp") << result;
  fs::rename(path + ".tmp", path);
}

// ---------------------------------------------------------------- parent side

namespace {

struct Results {
  std::vector<std::string> results, logs;
  std::string describe() const {
    std::string text;
    for (size_t r = 0; r < results.size(); ++r)
      text += "rank " + std::to_string(r) + ": " + results[r].substr(0, 300) + "\n  log: " + logs[r].substr(0, 1500) + "\n";
    return text;
  }
};

Results run_workers(const std::string& scenario, int world, const fs::path& dir,
                    std::map<std::string, std::string> env = {}) {
  distributed::TCPStore store("127.0.0.1", 0, true);
  env["KILN_ZERO_SCENARIO"] = scenario;
  env["KILN_ZERO_OUT"] = dir.string();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(store.port());
  env["OMP_NUM_THREADS"] = "1";
  env["KILN_DIST_TIMEOUT"] = "20";
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    pids.push_back(spawn(worker_command("zero_worker_entry"), env, dir / ("rank" + std::to_string(r) + ".log")));
  }
  wait_all(pids, 40);
  Results out;
  for (int r = 0; r < world; ++r) {
    out.results.push_back(read_file(dir / ("rank" + std::to_string(r) + ".txt")));
    out.logs.push_back(read_file(dir / ("rank" + std::to_string(r) + ".log")));
  }
  return out;
}

// Single-process AdamW on the whole batch, steps [first, last), from `model` and `optimizer` as they are.
void train_reference(nn::Module& model, optim::Optimizer& optimizer, int first, int last) {
  nn::MSELoss mse;
  for (int step = first; step < last; ++step) {
    auto [x, y] = batch(step, 0, kRows);
    mse(model.forward(x), y).backward();
    optimizer.step();
    optimizer.zero_grad();
  }
}

std::vector<double> reference_params(int steps) {
  auto model = make_model();
  auto adam = make_adam(param_groups(*model));
  train_reference(*model, *adam, 0, steps);
  return parse_numbers(values(*model));
}

// DDP averages in another order than one process sums: float64 agrees to ~1e-15.
void check_close(const std::vector<double>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
  CHECK(worst <= 1e-10);
}

}  // namespace

TEST_CASE("ZeroRedundancyOptimizer: equals plain DDP bit for bit, with 1/N of the optimizer state per rank") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    TempDir dir;
    const Results run = run_workers("parity", world, dir.path);
    INFO(run.describe());
    const std::vector<double> expected = reference_params(4);
    size_t total_zero_bytes = 0;
    std::vector<int> owners(2 * kLayers, -1);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      const auto got = fields(run.results[r]);
      REQUIRE(got.count("params") == 1);
      CHECK(got.at("max_difference") == "0");  // the same updates on the same values as plain DDP
      check_close(parse_numbers(got.at("params")), expected);
      const size_t plain_bytes = std::stoull(got.at("plain_state_bytes"));
      const size_t zero_bytes = std::stoull(got.at("zero_state_bytes"));
      CHECK(plain_bytes > 0);
      // AdamW keeps exp_avg and exp_avg_sq (2 x 8 bytes per element) and a step count per parameter.
      if (world == 2) CHECK(zero_bytes * 2 == plain_bytes);  // the sizes split evenly over 2 ranks
      if (world == 3) CHECK(zero_bytes * 3 <= plain_bytes + 3 * (2 * 256 * 8 + 64));  // off by at most one weight's
      total_zero_bytes += zero_bytes;
      for (double index : parse_numbers(got.at("owned"))) {
        CHECK(owners.at(static_cast<size_t>(index)) == -1);
        owners.at(static_cast<size_t>(index)) = r;
      }
    }
    CHECK(total_zero_bytes == std::stoull(fields(run.results[0]).at("plain_state_bytes")));
    for (int owner : owners) CHECK(owner >= 0);  // each parameter has exactly one owner
  }
}

TEST_CASE("ZeroRedundancyOptimizer: the full state saved on rank 0 of 2 loads into 3 ranks and into a plain "
          "optimizer, and training goes on as uninterrupted") {
  TempDir dir;
  const std::string file = (dir.path / "zero.safetensors").string();
  const Results saved = run_workers("save", 2, dir.path, {{"KILN_ZERO_FILE", file}});
  INFO(saved.describe());
  REQUIRE(fields(saved.results[0]).count("params") == 1);
  REQUIRE(fields(saved.results[1]).count("params") == 1);
  REQUIRE(fs::exists(file));
  const std::vector<double> expected = reference_params(6);

  TempDir resume_dir;
  const Results resumed = run_workers("resume", 3, resume_dir.path, {{"KILN_ZERO_FILE", file}});
  INFO(resumed.describe());
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    const auto got = fields(resumed.results[r]);
    REQUIRE(got.count("params") == 1);
    check_close(parse_numbers(got.at("params")), expected);
  }

  // The file's state is a plain AdamW's: it loads into one process and goes on the same.
  auto model = make_model();
  auto adam = make_adam(param_groups(*model));
  const optim::StateDict state = load_checkpoint(file, *model);
  CHECK(state.meta.at("state").size() == 2 * kLayers);
  adam->load_state_dict(state);
  train_reference(*model, *adam, 3, 6);
  check_close(parse_numbers(values(*model)), expected);
}

TEST_CASE("ZeroRedundancyOptimizer: bad input is named (one process)") {
  auto store = std::make_shared<distributed::TCPStore>("127.0.0.1", 0, true);
  auto group = std::make_shared<distributed::ProcessGroup>(store, 0, 1, distributed::ProcessGroupOptions{}, "zero/");
  auto model = make_model();
  CHECK_THROWS_WITH_AS(optim::ZeroRedundancyOptimizer(std::vector<Tensor>{}, make_adam, group),
                       doctest::Contains("empty parameter list"), Error);
  const Tensor p = model->parameters()[0];
  CHECK_THROWS_WITH_AS(optim::ZeroRedundancyOptimizer(std::vector<Tensor>{p, p}, make_adam, group),
                       doctest::Contains("appears more than once"), Error);
  // A factory that ignores its groups.
  auto wrong = [&](std::vector<optim::ParamGroup>) { return make_adam({optim::ParamGroup{{model->parameters()[1]}}}); };
  CHECK_THROWS_WITH_AS(optim::ZeroRedundancyOptimizer(std::vector<Tensor>{p}, wrong, group),
                       doctest::Contains("other parameters"), Error);
  optim::ZeroRedundancyOptimizer zero(param_groups(*model), make_adam, group);
  CHECK(zero.num_params() == 2 * kLayers);
  CHECK(zero.owned_params().size() == 2 * kLayers);  // one rank owns everything
  // The state of an optimizer with one group does not fit two.
  auto other = make_adam({optim::ParamGroup{model->parameters()}});
  CHECK_THROWS_WITH_AS(zero.load_state_dict(other->state_dict()), doctest::Contains("parameter groups"), Error);
  CHECK_THROWS_WITH_AS(zero.consolidate_state_dict(1), doctest::Contains("rank 1 is not in [0, 1)"), Error);
  // A group of one: consolidation is local and the state is a plain AdamW's.
  nn::MSELoss mse;
  auto [x, y] = batch(0, 0, kRows);
  mse(model->forward(x), y).backward();
  zero.step();
  zero.consolidate_state_dict(0);
  const optim::StateDict full = zero.state_dict();
  CHECK(full.meta.at("optimizer") == "AdamW");
  CHECK(full.meta.at("state").size() == 2 * kLayers);
  zero.step();  // a step makes the consolidated state stale
  CHECK_THROWS_WITH_AS((void)zero.state_dict(), doctest::Contains("consolidate again"), Error);
}
