// The Trainer's "ddp" strategy on the CPU (Gloo on loopback, 2 processes).
//
// Each case forks+execs this test binary running only the skipped test case
// "trainer_ddp_worker_entry" (selected with --no-skip), with torchrun's
// environment; the test hosts the rendezvous store as kiln-run does. The
// worker reads its scenario from KILN_TRAINER_SCENARIO and writes what it
// found to $KILN_TRAINER_OUT/rank<R>.txt as "key value..." lines (or
// "ERROR <message>"). References are computed here in one process on the
// concatenated batches. Workers run with OMP_NUM_THREADS=1 and a 20 s
// collective timeout, so a rank left waiting fails instead of hanging. The
// cases "under kiln-run" start the workers with kiln-run itself (faults,
// restarts): its log holds both ranks' output, prefixed "[rank R] ".
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stop_token>
#include <thread>

#include "core/distributed/process_group.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataloader.h"
#include "nn/layers.h"
#include "tests/support/trainer_fixtures.h"
#include "tests/test_distributed_util.h"
#include "trainer/trainer.h"

using namespace kiln;
using namespace kiln::testing::dist;

namespace {

std::string env_string(const char* name, const char* fallback = "") {
  const char* value = std::getenv(name);
  return value ? value : fallback;
}

std::shared_ptr<TensorDataset> regression_data(int64_t count, uint64_t seed) {
  manual_seed(seed);
  Tensor x = randn({count, 4}, {.dtype = DType::f64});
  Tensor y = add(sum(x, {1}, true), mul(randn({count, 1}, {.dtype = DType::f64}), 0.1));
  return std::make_shared<TensorDataset>(x, y);
}

// Linear(4, hidden), Tanh, [Linear(hidden, hidden), Tanh,] Linear(hidden, 1).
struct Mlp : TrainModule {
  explicit Mlp(int64_t hidden = 8, bool square_layer = false) {
    manual_seed(3);
    net.push_back(std::make_shared<nn::Linear>(4, hidden));
    net.push_back(std::make_shared<nn::Tanh>());
    if (square_layer) {
      net.push_back(std::make_shared<nn::Linear>(hidden, hidden));
      net.push_back(std::make_shared<nn::Tanh>());
    }
    net.push_back(std::make_shared<nn::Linear>(hidden, 1));
  }
  nn::Module& model() override { return net; }
  Tensor loss(const Batch& batch) {
    Tensor difference = net.forward(batch.input) - batch.target;
    return mean(difference * difference);
  }
  Tensor training_step(const Batch& batch, int64_t) override {
    Tensor value = loss(batch);
    log("train_loss", value, std::nullopt, true, false, batch.size());
    return value;
  }
  void validation_step(const Batch& batch, int64_t) override {
    log("val_loss", loss(batch), std::nullopt, std::nullopt, false, batch.size());
  }
  OptimizerConfigs configure_optimizers() override {
    return OptimizerConfig{std::make_unique<optim::SGD>(net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9})};
  }
  nn::Sequential net;
};

// The GAN of the seed documents: accumulation over two batches, toggle_model(sync_grad) per optimizer.
struct Gan : TrainModule {
  Gan() {
    automatic_optimization = false;
    manual_seed(21);
    generator = nets.register_module("generator", std::make_shared<nn::Linear>(2, 4));
    discriminator = nets.register_module("discriminator", std::make_shared<nn::Linear>(4, 1));
  }
  struct Nets : nn::Module {
    std::string type_name() const override { return "GanNets"; }
  };
  nn::Module& model() override { return nets; }
  OptimizerConfigs configure_optimizers() override {
    return {OptimizerConfig{std::make_unique<optim::SGD>(generator->parameters(), optim::SGDOptions{.lr = 0.05})},
            OptimizerConfig{std::make_unique<optim::Adam>(discriminator->parameters(), optim::AdamOptions{.lr = 0.01})}};
  }
  static Tensor square_mean(const Tensor& x) { return mean(x * x); }
  Tensor training_step(const Batch& batch, int64_t batch_idx) override {
    auto [g_opt, d_opt] = optimizers<2>();
    const bool last = (batch_idx + 1) % 2 == 0 || trainer()->is_last_batch();
    Tensor fake = generator->forward(batch.target);
    {
      auto toggled = d_opt.toggle_model(last);
      manual_backward(square_mean(discriminator->forward(batch.input) - 1.0) +
                      square_mean(discriminator->forward(fake.detach())));
      check_sync(last);
      if (last) {
        d_opt.step();
        d_opt.zero_grad();
      }
    }
    {
      auto toggled = g_opt.toggle_model(last);
      Tensor g_loss = square_mean(discriminator->forward(fake) - 1.0);
      manual_backward(g_loss);
      check_sync(last);
      if (last) {
        g_opt.step();
        g_opt.zero_grad();
      }
      log("g_loss", g_loss, std::nullopt, true, false, batch.size());
    }
    return Tensor();
  }
  // A backward inside toggle_model(sync_grad=false) must start no gradient synchronization.
  void check_sync(bool sync) {
    if (nn::DistributedDataParallel* ddp = trainer()->ddp()) sync_errors += ddp->gradient_sync_pending() != sync;
  }
  Nets nets;
  std::shared_ptr<nn::Linear> generator, discriminator;
  int sync_errors = 0;
};

// Asks the trainer to stop after batch 2 of the first epoch, on one rank only.
struct StopOnRank : Callback {
  explicit StopOnRank(int rank) : rank(rank) {}
  std::string name() const override { return "StopOnRank"; }
  void on_train_batch_end(Trainer& trainer, TrainModule&, int64_t batch_idx) override {
    if (trainer.global_rank() == rank && trainer.current_epoch() == 0 && batch_idx == 2) trainer.should_stop = true;
  }
  int rank;
};

// Under kiln-run: rank 1 exits at global step `step` of the run's first round
// (the restarted round trains on), before ModelCheckpoint saves that step.
struct CrashInFirstRound : Callback {
  explicit CrashInFirstRound(int64_t step) : step(step) {}
  std::string name() const override { return "CrashInFirstRound"; }
  void on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) override {
    if (trainer.global_rank() != 1 || trainer.global_step() != step) return;
    if (distributed::read_restart_round().restart_count != 0) return;
    std::printf("rank 1 crashing at step %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
    ::_exit(3);
  }
  int64_t step;
};

// The "torn" scenario's model: a 2048 x 2048 float64 layer makes a 67 MB
// checkpoint (weights and SGD momentum), long enough to write to be caught.
constexpr int64_t kWideHidden = 2048;

// Under kiln-run, on rank 1: makes rank 1 fail while rank 0 writes a
// checkpoint. save_safetensors writes "<path>.tmp.<pid>" and renames it when
// complete; once a complete last.safetensors exists, this watches for rank 0's
// next temporary file, stops rank 0 (SIGSTOP) and, when the file is still there
// with rank 0 stopped (else it lets rank 0 go on and waits for the next one),
// kills rank 1 (SIGKILL). The launcher then ends rank 0 in the middle of its write.
struct FailWhileRankZeroWrites : Callback {
  std::string name() const override { return "FailWhileRankZeroWrites"; }
  void on_train_start(Trainer& trainer, TrainModule&) override {
    if (trainer.global_rank() != 1) return;
    watcher = std::jthread([folder = fs::path(trainer.log_dir()) / "checkpoints", this](std::stop_token stop) {
      watch(folder, stop);
    });
  }
  void on_train_batch_end(Trainer& trainer, TrainModule&, int64_t) override { step = trainer.global_step(); }

  static bool stopped(pid_t pid) {
    const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'T';
  }
  void watch(const fs::path& folder, const std::stop_token& stop) {
    const std::string temporary_prefix = "last.safetensors.tmp.";
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!stop.stop_requested() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::error_code ignored;
      if (!fs::exists(folder / "last.safetensors", ignored)) continue;
      for (const auto& entry : fs::directory_iterator(folder, ignored)) {
        const std::string file = entry.path().filename().string();
        if (file.rfind(temporary_prefix, 0) != 0) continue;
        const pid_t writer = static_cast<pid_t>(std::stol(file.substr(temporary_prefix.size())));
        ::kill(writer, SIGSTOP);
        for (int i = 0; i < 2000 && !stopped(writer); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (stopped(writer) && fs::exists(entry.path(), ignored)) {
          std::printf("rank 1: rank 0 (pid %d) stopped while it writes step %lld's %s (%lld bytes so far); rank 1 "
                      "fails now\n", static_cast<int>(writer), static_cast<long long>(step.load()), file.c_str(),
                      static_cast<long long>(fs::file_size(entry.path(), ignored)));
          std::fflush(stdout);
          ::raise(SIGKILL);
        }
        ::kill(writer, SIGCONT);  // it finished first: the next save
      }
    }
  }
  std::atomic<int64_t> step{0};
  std::jthread watcher;  // last member: joined before the others go
};

TrainerOptions base_options(const std::string& root) {
  TrainerOptions options;
  options.accelerator = "cpu";
  options.precision = "64-true";
  options.default_root_dir = root;
  options.enable_progress_bar = false;
  options.num_sanity_val_steps = 0;
  options.deterministic = true;
  options.logger = false;
  return options;
}

std::string numbers(const nn::Module& model) {
  std::ostringstream out;
  out.precision(17);
  for (const Tensor& p : model.parameters()) {
    for (double v : p.to(DType::f64).to_vector<double>()) out << v << ' ';
  }
  return out.str();
}

// Per-rank batch size, accumulation, steps (or epochs for the GAN), data set size.
struct Setting {
  int64_t batch = 4, accumulate = 1, steps = 6, samples = 32;
};

// Trains `scenario`: under the launcher with "ddp" over `world` processes,
// else in one process on batches of 2 x setting.batch rows (2 ranks' worth).
std::string train(const std::string& scenario, const Setting& setting, int world, const std::string& root) {
  TrainerOptions options = base_options(root);
  const bool launched = distributed::launched_distributed();
  if (launched) {
    options.strategy = "ddp";
    options.devices = world;
  }
  DataLoaderOptions loading{.batch_size = setting.batch * (launched ? 1 : 2), .shuffle = true, .seed = 5};
  std::ostringstream out;
  out.precision(17);
  if (scenario == "gan") {
    options.max_epochs = setting.steps;
    manual_seed(8);
    auto data = std::make_shared<TensorDataset>(add(randn({setting.samples, 4}, {.dtype = DType::f64}), 2.0),
                                                randn({setting.samples, 2}, {.dtype = DType::f64}));
    Gan gan;
    DataLoader loader(data, loading);
    Trainer trainer(options);
    trainer.fit(gan, loader);
    out << "params " << numbers(gan.nets) << "\nglobal_step " << trainer.global_step() << "\nsync_errors "
        << gan.sync_errors << "\ng_loss_epoch " << trainer.callback_metrics().at("g_loss_epoch") << "\n";
    return out.str();
  }
  options.max_steps = setting.steps;
  options.accumulate_grad_batches = setting.accumulate;
  options.logger = launched;  // a ddp run also checks that rank 0 alone logs
  if (scenario == "stop") {
    options.max_steps = -1;
    options.max_epochs = 5;
    options.callbacks = {std::make_shared<StopOnRank>(1)};
  }
  if (scenario == "elastic") {
    // A checkpoint after every step; the restarted round's fit gets no ckpt_path.
    options.callbacks = {std::make_shared<ModelCheckpoint>(
        ModelCheckpointOptions{.save_top_k = 0, .save_last = true, .every_n_train_steps = 1})};
    if (const std::string crash = env_string("KILN_TRAINER_CRASH_AT_STEP"); !crash.empty()) {
      options.callbacks.push_back(std::make_shared<CrashInFirstRound>(std::stoll(crash)));
    }
  }
  if (scenario == "torn") {
    options.max_steps = 20;  // ends far later than the fault
    options.callbacks = {std::make_shared<ModelCheckpoint>(
                             ModelCheckpointOptions{.save_top_k = 0, .save_last = true, .every_n_train_steps = 1}),
                         std::make_shared<FailWhileRankZeroWrites>()};
  }
  auto data = regression_data(setting.samples, 11);
  auto val_data = regression_data(16, 12);
  std::string checkpoint;
  if (scenario == "resume") {
    // A checkpoint halfway (mid-epoch, as ModelCheckpoint's every_n_train_steps
    // writes one), then a new Trainer resumes from it.
    checkpoint = (fs::path(root) / "halfway.safetensors").string();
    TrainerOptions first = options;
    first.callbacks = {std::make_shared<testing::SaveCheckpointAtStep>(setting.steps / 2, checkpoint)};
    Mlp module;
    DataLoader loader(data, loading);
    DataLoader val(val_data, DataLoaderOptions{.batch_size = 4});
    Trainer(first).fit(module, loader, &val);
  }
  Mlp module(scenario == "torn" ? kWideHidden : 8, scenario == "torn");
  DataLoader loader(data, loading);
  DataLoader val(val_data, DataLoaderOptions{.batch_size = 4});
  Trainer trainer(options);
  trainer.fit(module, loader, &val, checkpoint);
  const auto& metrics = trainer.callback_metrics();
  out << "params " << numbers(module.net) << "\nglobal_step " << trainer.global_step() << "\nepoch "
      << trainer.current_epoch() << "\nval_loss " << (metrics.count("val_loss") ? metrics.at("val_loss") : -1.0)
      << "\ntrain_loss_epoch " << metrics.at("train_loss_epoch") << "\nhas_logger " << (trainer.logger() != nullptr)
      << "\nlog_dir " << trainer.log_dir() << "\nstop_reason " << trainer.stop_reason << "\nresumed_from "
      << trainer.ckpt_path() << "\nrestart " << distributed::read_restart_round().restart_count << "\n";
  return out.str();
}

Setting setting_from_env() {
  Setting setting;
  setting.batch = std::stoll(env_string("KILN_TRAINER_BATCH", "4"));
  setting.accumulate = std::stoll(env_string("KILN_TRAINER_ACCUMULATE", "1"));
  setting.steps = std::stoll(env_string("KILN_TRAINER_STEPS", "6"));
  setting.samples = std::stoll(env_string("KILN_TRAINER_SAMPLES", "32"));
  return setting;
}

std::map<std::string, std::string> setting_env(const Setting& setting) {
  return {{"KILN_TRAINER_BATCH", std::to_string(setting.batch)},
          {"KILN_TRAINER_ACCUMULATE", std::to_string(setting.accumulate)},
          {"KILN_TRAINER_STEPS", std::to_string(setting.steps)},
          {"KILN_TRAINER_SAMPLES", std::to_string(setting.samples)}};
}

struct Workers {
  std::vector<std::string> results, logs;
  std::vector<int> statuses;
  double seconds = 0;
  std::string describe() const {
    std::string text;
    for (size_t r = 0; r < results.size(); ++r) {
      text += "rank " + std::to_string(r) + " status " + std::to_string(statuses[r]) + " result: " +
              results[r].substr(0, 600) + "\n  log: " + logs[r].substr(0, 1500) + "\n";
    }
    return text;
  }
};

Workers run_workers(const std::string& scenario, const Setting& setting, const fs::path& dir, int world = 2) {
  distributed::TCPStore store("127.0.0.1", 0, true);
  std::map<std::string, std::string> env = setting_env(setting);
  env["KILN_TRAINER_SCENARIO"] = scenario;
  env["KILN_TRAINER_OUT"] = dir.string();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["WORLD_SIZE"] = std::to_string(world);
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(store.port());
  env["OMP_NUM_THREADS"] = "1";
  env["KILN_DIST_TIMEOUT"] = "20";
  const std::vector<std::string> command = {self_exe(), "--test-case=trainer_ddp_worker_entry", "--no-skip=true",
                                            "--no-version=true", "--no-intro=true", "--minimal=true"};
  const auto start = Clock::now();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    pids.push_back(spawn(command, env, dir / ("rank" + std::to_string(r) + ".log")));
  }
  Workers workers;
  workers.statuses = wait_all(pids, 60);
  workers.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (int r = 0; r < world; ++r) {
    workers.results.push_back(read_file(dir / ("rank" + std::to_string(r) + ".txt")));
    workers.logs.push_back(read_file(dir / ("rank" + std::to_string(r) + ".log")));
  }
  return workers;
}

// Trains `scenario` on 2 processes started by kiln-run with `flags`; the
// launcher's output (workers prefixed "[rank R] ") goes to dir/launcher.log.
Workers run_launcher(const std::string& scenario, const Setting& setting, const fs::path& dir,
                     const std::vector<std::string>& flags, std::map<std::string, std::string> env) {
  const fs::path launcher = fs::path(self_exe()).parent_path() / "kiln-run";
  REQUIRE_MESSAGE(fs::exists(launcher), "kiln-run not found next to kiln_tests: build the kiln-run target");
  std::vector<std::string> argv = {launcher.string(), "--nproc-per-node", "2", "--master-port", "0"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  for (const std::string& arg : {std::string("--"), self_exe(), std::string("--test-case=trainer_ddp_worker_entry"),
                                 std::string("--no-skip=true"), std::string("--no-version=true"),
                                 std::string("--no-intro=true"), std::string("--minimal=true")}) {
    argv.push_back(arg);
  }
  for (const auto& [key, value] : setting_env(setting)) env[key] = value;
  env["KILN_TRAINER_SCENARIO"] = scenario;
  env["KILN_TRAINER_OUT"] = dir.string();
  env["OMP_NUM_THREADS"] = "1";
  env["KILN_DIST_TIMEOUT"] = "20";
  const auto start = Clock::now();
  const int status = wait_all({spawn(argv, env, dir / "launcher.log")}, 90).at(0);
  Workers workers;
  workers.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Per rank, as describe() reads them: the launcher's status, and its log (holding both ranks' lines) once.
  workers.statuses = {status, status};
  workers.logs = {read_file(dir / "launcher.log"), ""};
  for (int r = 0; r < 2; ++r) workers.results.push_back(read_file(dir / ("rank" + std::to_string(r) + ".txt")));
  return workers;
}

// Every rank's parameters (and `keys`) equal the single-process reference within `atol`.
void check_matches(const Workers& workers, const std::string& reference, const std::vector<std::string>& keys,
                   double atol) {
  INFO(workers.describe());
  const auto expected = fields(reference);
  for (size_t r = 0; r < workers.results.size(); ++r) {
    CAPTURE(r);
    const auto got = fields(workers.results[r]);
    REQUIRE(got.count("params") == 1);
    const std::vector<double> a = parse_numbers(got.at("params")), b = parse_numbers(expected.at("params"));
    REQUIRE(a.size() == b.size());
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
    CHECK(worst <= atol);
    for (const std::string& key : keys) {
      CAPTURE(key);
      REQUIRE(got.count(key) == 1);
      CHECK(std::stod(got.at(key)) == doctest::Approx(std::stod(expected.at(key))).epsilon(1e-9));
    }
  }
}

}  // namespace

TEST_CASE("trainer_ddp_worker_entry" * doctest::skip()) {
  const std::string scenario = env_string("KILN_TRAINER_SCENARIO");
  if (scenario.empty()) return;
  const std::string out = env_string("KILN_TRAINER_OUT");
  const std::string path = out + "/rank" + env_string("RANK", "0") + ".txt";
  std::string result;
  try {
    result = train(scenario, setting_from_env(), std::stoi(env_string("WORLD_SIZE", "1")), out + "/logs");
    distributed::destroy_process_group();
  } catch (const std::exception& e) {
    result = std::string("ERROR ") + e.what();
  }
  std::ofstream(path + ".tmp") << result;
  fs::rename(path + ".tmp", path);
}

TEST_CASE("Trainer ddp: 2 processes equal one process on the concatenated batch; rank 0 alone logs") {
  TempDir dir;
  const Setting setting;  // 6 steps of 2 x 4 rows, over two epochs of 32 samples, shuffled
  const Workers workers = run_workers("parity", setting, dir.path);
  TempDir reference_dir;
  const std::string reference = train("parity", setting, 1, reference_dir.path.string());
  check_matches(workers, reference, {"val_loss", "train_loss_epoch"}, 1e-10);
  const auto rank0 = fields(workers.results[0]), rank1 = fields(workers.results[1]);
  CHECK(rank0.at("global_step") == "6");
  CHECK(rank0.at("has_logger") == "1");
  CHECK(rank1.at("has_logger") == "0");
  CHECK(rank1.at("log_dir") == rank0.at("log_dir"));
  // One version folder, written by rank 0, holding both ranks' averaged metrics.
  const fs::path logs = dir.path / "logs" / "lightning_logs";
  CHECK(fs::exists(logs / "version_0" / "metrics.csv"));
  CHECK_FALSE(fs::exists(logs / "version_1"));
  CHECK(read_file(logs / "version_0" / "metrics.csv").find("val_loss") != std::string::npos);
}

TEST_CASE("Trainer ddp: resumed mid-epoch, the epoch's logged means are the uninterrupted run's") {
  // 4 steps of 2 x 4 rows make epoch 0 (32 samples); the checkpoint is taken
  // after step 2. The file holds the epoch sums of both ranks, so the resumed
  // train_loss_epoch averages all 4 batches of both ranks.
  TempDir dir;
  Setting setting;
  setting.steps = 4;
  const Workers workers = run_workers("resume", setting, dir.path);
  TempDir reference_dir;
  const std::string reference = train("parity", setting, 1, reference_dir.path.string());
  check_matches(workers, reference, {"val_loss", "train_loss_epoch"}, 1e-10);
  CHECK(fields(workers.results[0]).at("global_step") == "4");
}

TEST_CASE("Trainer ddp: a launched group of one process trains as plain single-device training") {
  TempDir dir;
  Setting setting;
  setting.batch = 8;
  const Workers workers = run_workers("parity", setting, dir.path, /*world=*/1);
  setting.batch = 4;  // x 2 in the single-process reference
  TempDir reference_dir;
  check_matches(workers, train("parity", setting, 1, reference_dir.path.string()), {"val_loss"}, 1e-12);
}

TEST_CASE("Trainer ddp: accumulation over 4 micro-batches on 2 processes equals the large batch") {
  TempDir dir;
  Setting setting;
  setting.batch = 2;
  setting.accumulate = 4;
  setting.samples = 64;
  const Workers workers = run_workers("parity", setting, dir.path);
  Setting large = setting;  // one process: 2 x 2 rows per batch ...
  large.batch = 8;          // ... times 4 micro-batches, no accumulation
  large.accumulate = 1;
  TempDir reference_dir;
  check_matches(workers, train("parity", large, 1, reference_dir.path.string()), {"train_loss_epoch"}, 1e-10);
}

TEST_CASE("Trainer ddp: a stop requested on one rank stops both at the same step, without waiting") {
  TempDir dir;
  const Workers workers = run_workers("stop", Setting{}, dir.path);
  INFO(workers.describe());
  const auto rank0 = fields(workers.results[0]), rank1 = fields(workers.results[1]);
  REQUIRE(rank0.count("global_step") == 1);
  REQUIRE(rank1.count("global_step") == 1);
  CHECK(rank0.at("global_step") == "3");  // after batch 2 of epoch 0, not after 5 epochs
  CHECK(rank1.at("global_step") == "3");
  CHECK(rank0.at("stop_reason") == "another rank requested the stop");
  CHECK(workers.seconds < 15);  // no rank waited for the 20 s collective timeout
}

TEST_CASE("Trainer ddp: the manual GAN loop with toggle_model(sync_grad) equals one process") {
  TempDir dir;
  Setting setting;
  setting.batch = 2;   // per rank; 4 batches of an epoch of 16 samples, a step every 2
  setting.steps = 2;   // epochs
  setting.samples = 16;
  const Workers workers = run_workers("gan", setting, dir.path);
  TempDir reference_dir;
  const std::string reference = train("gan", setting, 1, reference_dir.path.string());
  check_matches(workers, reference, {"g_loss_epoch"}, 1e-10);
  for (const std::string& result : workers.results) {
    const auto got = fields(result);
    CHECK(got.at("sync_errors") == "0");
    CHECK(got.at("global_step") == "8");  // 2 optimizers x 2 steps x 2 epochs
  }
}

TEST_CASE("Trainer ddp under kiln-run: a worker that crashes once is restarted, the Trainer resumes from the last "
          "checkpoint by itself, and the weights end bit for bit as an uninterrupted run's") {
  Setting setting;  // 6 steps of 2 x 4 rows; epoch 0 is 4 steps
  TempDir uninterrupted_dir;
  const Workers uninterrupted = run_launcher("elastic", setting, uninterrupted_dir.path, {}, {});
  INFO("uninterrupted run:\n", uninterrupted.describe());
  REQUIRE(WIFEXITED(uninterrupted.statuses[0]));
  REQUIRE(WEXITSTATUS(uninterrupted.statuses[0]) == 0);
  const auto reference = fields(uninterrupted.results[0]);
  REQUIRE(reference.count("params") == 1);
  CHECK(reference.at("global_step") == "6");
  CHECK(reference.at("resumed_from").empty());
  CHECK(reference.at("restart") == "0");

  // Rank 1 exits at step 3 (mid-epoch); the last checkpoint is step 2's.
  TempDir dir;
  const Workers crashed =
      run_launcher("elastic", setting, dir.path, {"--max-restarts", "1"}, {{"KILN_TRAINER_CRASH_AT_STEP", "3"}});
  const std::string& log = crashed.logs.at(0);
  INFO("restarted run:\n", crashed.describe());
  CHECK(WIFEXITED(crashed.statuses[0]));
  CHECK(WEXITSTATUS(crashed.statuses[0]) == 0);
  CHECK(log.find("[rank 1] rank 1 crashing at step 3") != std::string::npos);
  CHECK(log.find("restarting all workers (restart 1 of 1)") != std::string::npos);
  CHECK(log.find("[rank 0] Trainer: restart 1 of the run: resuming from '") != std::string::npos);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto got = fields(crashed.results[r]);
    REQUIRE(got.count("params") == 1);
    CHECK(got.at("params") == reference.at("params"));  // 17 digits: every bit of each double
    CHECK(got.at("global_step") == "6");
    CHECK(got.at("restart") == "1");
    CHECK(got.at("resumed_from") ==
          (dir.path / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.safetensors").string());
  }
}

TEST_CASE("Trainer ddp under kiln-run: a restarted round starts afresh when the run wrote no checkpoint, ignoring "
          "an older run's last.safetensors") {
  Setting setting;
  setting.steps = 3;
  TempDir reference_dir;
  const Workers reference_run = run_launcher("elastic", setting, reference_dir.path, {}, {});
  INFO("uninterrupted run:\n", reference_run.describe());
  const auto reference = fields(reference_run.results[0]);
  REQUIRE(reference.count("params") == 1);
  // An older run's checkpoint where the restarted round looks (it loads: were it taken, the run would resume).
  TempDir dir;
  const fs::path stale = dir.path / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.safetensors";
  fs::create_directories(stale.parent_path());
  fs::copy_file(reference_dir.path / "logs" / "lightning_logs" / "version_0" / "checkpoints" / "last.safetensors",
                stale);
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(1));
  // Rank 1 exits at step 1, before the first checkpoint is written.
  const Workers crashed =
      run_launcher("elastic", setting, dir.path, {"--max-restarts", "1"}, {{"KILN_TRAINER_CRASH_AT_STEP", "1"}});
  const std::string& log = crashed.logs.at(0);
  INFO("restarted run:\n", crashed.describe());
  CHECK(WIFEXITED(crashed.statuses[0]));
  CHECK(WEXITSTATUS(crashed.statuses[0]) == 0);
  CHECK(log.find("restarting all workers (restart 1 of 1)") != std::string::npos);
  CHECK(log.find("no last.safetensors written since the run began") != std::string::npos);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const auto got = fields(crashed.results[r]);
    REQUIRE(got.count("params") == 1);
    CHECK(got.at("resumed_from").empty());
    CHECK(got.at("restart") == "1");
    CHECK(got.at("params") == reference.at("params"));
  }
}

TEST_CASE("Trainer ddp under kiln-run: a checkpoint that rank 0 writes while rank 1 fails is complete or absent, "
          "never torn") {
  TempDir dir;
  Setting setting;
  setting.samples = 160;  // 20 steps in one epoch: the fault comes long before the run could end
  const Workers run = run_launcher("torn", setting, dir.path, {}, {});
  const std::string& log = run.logs.at(0);
  INFO(run.describe());
  CHECK(WIFEXITED(run.statuses[0]));
  CHECK(WEXITSTATUS(run.statuses[0]) == 128 + SIGKILL);  // rank 1's end
  const size_t said = log.find("rank 1: rank 0 (pid ");
  REQUIRE(said != std::string::npos);
  const pid_t writer = static_cast<pid_t>(std::stol(log.substr(said + 20)));
  const int64_t step = std::stoll(log.substr(log.find("writes step ", said) + 12));
  CHECK(::kill(writer, 0) == -1);  // the launcher ended rank 0, stopped mid-write
  const fs::path folder = dir.path / "logs" / "lightning_logs" / "version_0" / "checkpoints";
  // The write was cut: its temporary file is left, never renamed into place.
  CHECK(fs::exists(folder / ("last.safetensors.tmp." + std::to_string(writer))));
  // What is in place is the previous step's checkpoint, whole: every part reads and checks.
  Mlp module(kWideHidden, true);
  const TrainerCheckpointFile file = read_trainer_checkpoint((folder / "last.safetensors").string(), module.net, 1);
  CHECK(file.progress.global_step == step - 1);
  CHECK(file.optimizers.size() == 1);
}
