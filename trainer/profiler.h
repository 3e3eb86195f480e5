// Lightning's profilers for the Trainer. The Trainer wraps its hooks and
// steps in profile("<action>") scopes with Lightning's action names
// ("run_training_epoch", "run_training_batch",
// "[LightningModule]<Module>.training_step", ...) and calls describe() when a
// stage ends:
//   PassThroughProfiler  ("" / default): times nothing; its scopes are NVTX ranges only
//   SimpleProfiler       ("simple"): time per action, Lightning's table
//   PyTorchProfiler      ("pytorch"): kiln's op profiler (core/profiler.h) on
//                        for the whole stage: per-op calls and backward
//                        CPU/CUDA time, plus each action as a timed range
// Every profile() scope is also an NVTX range for Nsight Systems.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/profiler.h"

namespace kiln {

class Profiler {
 public:
  // With a filename, describe() appends the report to
  // <dirpath or the log dir>/<stage>-<filename>.txt; without, prints it to stdout.
  explicit Profiler(std::string dirpath = "", std::string filename = "");
  virtual ~Profiler() = default;

  // Starts or stops timing `action_name`; throw kiln::Error when the action is
  // already running or was never started.
  virtual void start(const std::string& action_name) = 0;
  virtual void stop(const std::string& action_name) = 0;
  // The report (empty when nothing is measured).
  virtual std::string summary() = 0;

  class Scope {
   public:
    Scope(Profiler& profiler, std::string action_name);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler& profiler_;
    std::string action_name_;
  };
  // Times the enclosing scope as `action_name` (Lightning's `with profiler.profile(...)`).
  [[nodiscard]] Scope profile(std::string action_name) { return Scope(*this, std::move(action_name)); }

  // Called by the Trainer when a stage ("fit", "validate", "test", "predict")
  // starts; `log_dir` is where reports go when no dirpath was given.
  virtual void setup(const std::string& stage, const std::string& log_dir);
  virtual void teardown() {}
  // Writes summary() (see the constructor), then teardown().
  void describe();
  const std::string& stage() const { return stage_; }

 protected:
  std::string dirpath_;
  std::string filename_;
  std::string stage_;
};

class PassThroughProfiler final : public Profiler {
 public:
  void start(const std::string&) override {}
  void stop(const std::string&) override {}
  std::string summary() override { return ""; }
};

struct ActionStats {
  std::string name;
  int64_t calls = 0;
  double total_seconds = 0;
  double mean_seconds() const { return calls > 0 ? total_seconds / static_cast<double>(calls) : 0.0; }
};

class SimpleProfiler : public Profiler {
 public:
  // extended: Lightning's table with calls and percentages (else mean and total only).
  explicit SimpleProfiler(std::string dirpath = "", std::string filename = "", bool extended = true);
  void start(const std::string& action_name) override;
  void stop(const std::string& action_name) override;
  // "FIT Profiler Report" and Lightning's table, sorted by total time;
  // percentages are of the time since this profiler was made.
  std::string summary() override;
  // Per action, sorted by total time (longest first).
  std::vector<ActionStats> stats() const;

 private:
  bool extended_;
  std::chrono::steady_clock::time_point created_;
  std::map<std::string, std::chrono::steady_clock::time_point> running_;
  std::map<std::string, ActionStats> recorded_;
};

// Lightning's "pytorch" profiler, made of kiln's op profiler: op-level
// statistics (calls, backward CPU time, CUDA time from events) for everything
// run between setup() and teardown(), and each action as a timed range on
// `device`'s stream. The op profiler belongs to the thread that calls setup().
class PyTorchProfiler : public Profiler {
 public:
  explicit PyTorchProfiler(std::string dirpath = "", std::string filename = "", int row_limit = 20,
                           Device device = Device::cpu());
  void start(const std::string& action_name) override;
  void stop(const std::string& action_name) override;
  // The op profiler's tables (waits for pending CUDA events).
  std::string summary() override;
  void setup(const std::string& stage, const std::string& log_dir) override;
  void teardown() override;
  void set_device(Device device) { device_ = device; }
  OpProfiler& op_profiler() { return op_profiler_; }

 private:
  OpProfiler op_profiler_;
  int row_limit_;
  Device device_;
  std::map<std::string, OpProfiler::Interval> running_;
};

// One trainer stage ("fit", "validate", ...): setup() now; finish() writes
// the report (describe(), where `report`: rank 0) or tears down; a stage left
// by an exception is torn down (the op profiler is switched off).
class ProfilerStage {
 public:
  ProfilerStage(Profiler& profiler, const std::string& stage, const std::string& log_dir);
  ~ProfilerStage();
  ProfilerStage(const ProfilerStage&) = delete;
  ProfilerStage& operator=(const ProfilerStage&) = delete;
  void finish(bool report);

 private:
  Profiler& profiler_;
  bool finished_ = false;
};

// The unqualified class name of `type` ("Regression" for a struct
// kiln::Regression), as Python's __class__.__name__ in Lightning's action names.
std::string class_name(const std::type_info& type);

// The profiler for Trainer(profiler=name): "" -> PassThroughProfiler,
// "simple", "pytorch". Throws kiln::Error for "advanced" (Lightning's
// cProfile-based profiler has no kiln counterpart) and unknown names.
std::shared_ptr<Profiler> make_profiler(const std::string& name, Device device = Device::cpu());

}  // namespace kiln
