// Trainer checkpoints whose Trainer-side parts are corrupt: the logged
// metrics, the built-in callbacks' states and the training loader's state
// (and core/saved_json.h, the checked reads they use).
// Each corruption must be a kiln::Error naming the file and the key, and a
// checkpoint that fails to load must leave the trainer, its callbacks, the
// model and the loader as they were (their state_dict()s compared).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/saved_json.h"
#include "core/serialization.h"
#include "data/dataloader.h"
#include "tests/support/test_util.h"
#include "tests/support/trainer_fixtures.h"
#include "trainer/batch_size_finder.h"
#include "trainer/swa_callback.h"
#include "trainer/timer.h"
#include "trainer/trainer.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

using MetadataEdit = std::function<void(nlohmann::json&)>;

constexpr int64_t kCheckpointStep = 6;  // 4 batches per epoch: mid-epoch 1

// The run every case loads into: a regression with the built-in callbacks
// that keep state, a shuffled loader and a validation loader.
struct Run {
  explicit Run(const fs::path& root) : folder(root) {
    module.options.train_loss_on_epoch = true;  // an epoch value in the checkpoint's "logged"
    EarlyStoppingOptions early;
    early.patience = 5;
    ModelCheckpointOptions model_checkpoint;
    model_checkpoint.dirpath = (root / "checkpoints").string();
    model_checkpoint.monitor = "val_loss";
    callbacks = {std::make_shared<EarlyStopping>(early), std::make_shared<ModelCheckpoint>(model_checkpoint),
                 std::make_shared<Timer>(),
                 std::make_shared<StochasticWeightAveraging>(StochasticWeightAveragingOptions{
                     .swa_lrs = {0.01}, .swa_epoch_start = int64_t{1}})};
  }
  Trainer trainer(std::vector<std::shared_ptr<Callback>> extra = {}) const {
    TrainerOptions options = testing::quiet_trainer_options(folder);
    options.logger = false;
    options.max_epochs = 3;
    options.callbacks = callbacks;
    options.callbacks.insert(options.callbacks.end(), extra.begin(), extra.end());
    return Trainer(options);
  }
  fs::path folder;
  testing::Regression module;
  std::shared_ptr<TensorDataset> data = testing::regression_data(16, 0.1);
  DataLoader train{data, testing::seeded_loader_options(4)};
  DataLoader val{data, testing::seeded_loader_options(8, false)};
  std::vector<std::shared_ptr<Callback>> callbacks;
};

// A checkpoint written mid-epoch 1 by a real fit: logged epoch values,
// callback_metrics, and every callback's state (SWA averaging since epoch 0).
std::string saved_checkpoint(const fs::path& folder) {
  const std::string path = (folder / "saved.safetensors").string();
  Run run(folder / "writer");
  Trainer trainer = run.trainer({std::make_shared<testing::SaveCheckpointAtStep>(kCheckpointStep, path)});
  trainer.fit(run.module, run.train, &run.val);
  return path;
}

// `source` with its "kiln" metadata edited, as <folder>/<name>.safetensors.
std::string edited(const std::string& source, const fs::path& folder, const std::string& name,
                   const MetadataEdit& edit) {
  SafetensorsFile file = load_safetensors(source);
  nlohmann::json meta = nlohmann::json::parse(file.metadata.at("kiln"));
  edit(meta);
  const std::string path = (folder / (name + ".safetensors")).string();
  save_safetensors(path, file.tensors, {{"kiln", meta.dump()}});
  return path;
}

// Everything a failed load must leave as it was.
struct Observed {
  int64_t epoch, global_step;
  std::map<std::string, double> callback_metrics;
  std::vector<nlohmann::json> callback_states;
  nlohmann::json loader_state;
  std::vector<float> weights;
  bool operator==(const Observed&) const = default;
};

Observed observe(const Trainer& trainer, Run& run) {
  Observed out{trainer.current_epoch(), trainer.global_step(), trainer.callback_metrics(), {},
               run.train.state_dict(), run.module.net->weight.to_vector<float>()};
  for (const auto& callback : trainer.callbacks()) out.callback_states.push_back(callback->state_dict());
  return out;
}

// fit(ckpt_path = path) must throw a kiln::Error naming the file and containing `expected`.
void check_fit_fails(Trainer& trainer, Run& run, const std::string& path, const std::string& expected) {
  const std::string message = testing::error_of([&] { trainer.fit(run.module, run.train, &run.val, path); });
  CHECK_MESSAGE(message.find(path) != std::string::npos, "no error naming the file: '", message, "'");
  CHECK_MESSAGE(message.find(expected) != std::string::npos, "expected '", expected, "' in: '", message, "'");
}

nlohmann::json& callback_state(nlohmann::json& meta, const char* name) { return meta["callbacks"][name]; }

}  // namespace

TEST_CASE("Checkpoint validation: corrupt metrics, callback and loader states are kiln::Errors naming file and key") {
  const fs::path folder = testing::fresh_folder("ckpt_validation", "kinds");
  const std::string saved = saved_checkpoint(folder);
  {  // The unedited file resumes (so the errors below come from the edits).
    Run run(folder / "clean");
    Trainer trainer = run.trainer();
    trainer.fit(run.module, run.train, &run.val, edited(saved, folder, "clean", [](nlohmann::json&) {}));
    CHECK(trainer.global_step() == 12);
  }
  const std::vector<std::pair<MetadataEdit, std::string>> cases = {
      // Metrics: nlohmann's type_error escaped for bits that are not an integer; a float count was truncated.
      {[](nlohmann::json& m) { m["metrics"]["callback_metrics"]["val_loss"] = "low"; }, "\"val_loss\" is \"low\""},
      {[](nlohmann::json& m) { m["metrics"]["callback_metrics"]["val_loss"] = 0.5; }, "\"val_loss\" is 0.5"},
      {[](nlohmann::json& m) { m["metrics"]["logged"][0]["count"] = 2.5; }, "\"count\" is 2.5"},
      {[](nlohmann::json& m) { m["metrics"]["logged"][0]["count"] = -2; }, "\"count\" is -2"},
      {[](nlohmann::json& m) { m["metrics"]["logged"][0]["sum"] = -1; }, "\"sum\" is -1"},
      {[](nlohmann::json& m) { m["metrics"]["logged"][0]["on_step"] = 1; }, "\"on_step\" is 1"},
      {[](nlohmann::json& m) { m["metrics"]["logged"][0].erase("name"); }, "no \"name\""},
      {[](nlohmann::json& m) { m["metrics"]["logged"] = 5; }, "\"logged\" is 5"},
      {[](nlohmann::json& m) { m["metrics"]["logged"].push_back(m["metrics"]["logged"][0]); }, "logged twice"},
      // Progress flags and hyperparameters: nlohmann's message named no key.
      {[](nlohmann::json& m) { m["epoch_end_hooks_done"] = 1; }, "\"epoch_end_hooks_done\" is 1"},
      {[](nlohmann::json& m) { m["hyperparameters"] = {{"lr", 0.1}}; }, "\"lr\" is 0.1"},
      {[](nlohmann::json& m) { m["callbacks"] = 3; }, "\"callbacks\" is 3"},
      // EarlyStopping: floats were truncated into the counters, the patience too.
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping")["wait_count"] = 1.5; },
       "callback 'EarlyStopping'"},
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping")["wait_count"] = -1; }, "\"wait_count\" is -1"},
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping")["best_score"] = "low"; },
       "\"best_score\" is \"low\""},
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping")["stopped_epoch"] = -3; },
       "\"stopped_epoch\" is -3"},
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping")["patience"] = 2.5; }, "\"patience\" is 2.5"},
      {[](nlohmann::json& m) { callback_state(m, "EarlyStopping").erase("wait_count"); }, "no \"wait_count\""},
      // ModelCheckpoint.
      {[](nlohmann::json& m) { callback_state(m, "ModelCheckpoint")["best_k_models"] = {1, 2}; },
       "\"best_k_models\" is [1,2]"},
      {[](nlohmann::json& m) { callback_state(m, "ModelCheckpoint")["best_k_models"]["a.safetensors"] = "x"; },
       "\"a.safetensors\" is \"x\""},
      {[](nlohmann::json& m) { callback_state(m, "ModelCheckpoint")["last_saved_step"] = 1.5; },
       "\"last_saved_step\" is 1.5"},
      {[](nlohmann::json& m) { callback_state(m, "ModelCheckpoint")["best_model_path"] = 3; },
       "\"best_model_path\" is 3"},
      // Timer.
      {[](nlohmann::json& m) { callback_state(m, "Timer")["time_elapsed"]["train"] = -1; }, "\"train\" is -1"},
      {[](nlohmann::json& m) { callback_state(m, "Timer")["time_elapsed"] = "long"; }, "\"time_elapsed\" is"},
      // StochasticWeightAveraging: its average is decoded when the checkpoint loads, not at on_fit_start.
      {[](nlohmann::json& m) { callback_state(m, "StochasticWeightAveraging")["latest_update_epoch"] = 0.5; },
       "\"latest_update_epoch\" is 0.5"},
      {[](nlohmann::json& m) { callback_state(m, "StochasticWeightAveraging")["swa_started"] = "yes"; },
       "\"swa_started\" is \"yes\""},
      // Its bytes are a tensor of the file: the place they load into must be null.
      {[](nlohmann::json& m) {
         callback_state(m, "StochasticWeightAveraging")["average_model_state"]["tensors"]["param.weight"]["data"] =
             "!!!!";
       },
       "does not name a null value of the callback states"},
      {[](nlohmann::json& m) {
         callback_state(m, "StochasticWeightAveraging")["average_model_state"]["tensors"]["param.weight"]["shape"] =
             {-1, 4};
       },
       "\"shape\" is [-1,4]"},
      {[](nlohmann::json& m) {
         callback_state(m, "StochasticWeightAveraging")["average_model_state"]["meta"]["n_averaged"] = 1.5;
       },
       "\"n_averaged\" is 1.5"},
      {[](nlohmann::json& m) {
         callback_state(m, "StochasticWeightAveraging")["average_model_state"]["tensors"]["param.weight"]["shape"] =
             {2, 2};
       },
       "'param.weight' is missing or has another shape"},
      // The loader: a float position was truncated, a negative epoch or seed wrapped around.
      {[](nlohmann::json& m) { m["loader"]["position"] = 1.5; }, "\"position\" is 1.5"},
      {[](nlohmann::json& m) { m["loader"]["position"] = 9; }, "position 9 is outside the epoch's 4 batches"},
      {[](nlohmann::json& m) { m["loader"]["epoch"] = -1; }, "\"epoch\" is -1"},
      {[](nlohmann::json& m) { m["loader"]["epoch"] = 1.5; }, "\"epoch\" is 1.5"},
      {[](nlohmann::json& m) { m["loader"]["seed"] = -3; }, "\"seed\" is -3"},
      {[](nlohmann::json& m) { m["loader"]["batch_size"] = 7; }, "saved with batch_size 7"},
      {[](nlohmann::json& m) { m["loader"].erase("epoch"); }, "no \"epoch\""},
      {[](nlohmann::json& m) { m["loader"] = 4; }, "train loader state"},
  };
  int index = 0;
  for (const auto& [edit, expected] : cases) {
    CAPTURE(expected);
    Run run(folder / "case");
    Trainer trainer = run.trainer();
    check_fit_fails(trainer, run, edited(saved, folder, "case" + std::to_string(index++), edit), expected);
  }
  {  // Each part names itself: a callback's error names the callback, the loader's "train loader state".
    Run run(folder / "names");
    Trainer trainer = run.trainer();
    check_fit_fails(trainer, run, edited(saved, folder, "timer", [](nlohmann::json& m) {
                      callback_state(m, "Timer")["time_elapsed"]["train"] = "1s";
                    }),
                    "callback 'Timer'");
    check_fit_fails(trainer, run, edited(saved, folder, "loader", [](nlohmann::json& m) {
                      m["loader"]["position"] = -1;
                    }),
                    "train loader state");
    check_fit_fails(trainer, run, edited(saved, folder, "metrics", [](nlohmann::json& m) {
                      m["metrics"]["logged"][0]["count"] = 0.5;
                    }),
                    "corrupt metadata: metrics");
  }
  {  // Binary callback state (SWA's averaged tensors) is stored as u8 tensors named "callbacks" + its JSON
     // pointer, with null in the metadata: the header stays small. Each tensor is checked as it is put back.
    const std::string blob = "callbacks/StochasticWeightAveraging/average_model_state/tensors/param.weight/data";
    const SafetensorsFile file = load_safetensors(saved);
    const nlohmann::json meta = nlohmann::json::parse(file.metadata.at("kiln"));
    CHECK(meta["callbacks"]["StochasticWeightAveraging"]["average_model_state"]["tensors"]["param.weight"]["data"]
              .is_null());
    const auto found = std::find_if(file.tensors.begin(), file.tensors.end(),
                                    [&](const auto& named) { return named.first == blob; });
    REQUIRE(found != file.tensors.end());
    CHECK(found->second.dtype() == DType::u8);
    CHECK(found->second.numel() == static_cast<int64_t>(Run(folder / "shape").module.net->weight.nbytes()));
    using FileEdit = std::function<void(nlohmann::json&, NamedTensorList&)>;
    auto without_blobs = [](NamedTensorList& t) {
      std::erase_if(t, [](const auto& named) { return named.first.rfind("callbacks/", 0) == 0; });
    };
    const std::vector<std::pair<FileEdit, std::string>> file_cases = {
        {[&](nlohmann::json& m, NamedTensorList& t) {
           callback_state(m, "StochasticWeightAveraging")["average_model_state"] = 3;
           without_blobs(t);
         },
         "\"average_model_state\" is 3"},
        // fuzz_trainer_checkpoint finding: started without an average, the epoch's end called through a null
        // pointer.
        {[&](nlohmann::json& m, NamedTensorList& t) {
           callback_state(m, "StochasticWeightAveraging").erase("average_model_state");
           without_blobs(t);
         },
         "\"swa_started\" is true but there is no \"average_model_state\""},
        {[&](nlohmann::json&, NamedTensorList& t) {
           for (auto& [name, tensor] : t) {
             if (name == blob) tensor = zeros({tensor.numel()}, {.dtype = DType::f32});
           }
         },
         "(expected the 1-D u8 bytes of a callback state)"},
        {[&](nlohmann::json&, NamedTensorList& t) {
           for (auto& [name, tensor] : t) {
             if (name == blob) name = "callbacks/StochasticWeightAveraging/nowhere";
           }
         },
         "'callbacks/StochasticWeightAveraging/nowhere' does not name a null value"},
        {[&](nlohmann::json&, NamedTensorList& t) {
           for (auto& [name, tensor] : t) {
             if (name == blob) name = "callbacks/~2";  // not a JSON pointer
           }
         },
         "'callbacks/~2' does not name a null value"},
        {[&](nlohmann::json&, NamedTensorList& t) {
           std::erase_if(t, [&](const auto& named) { return named.first == blob; });
         },
         "\"data\" is null (expected the tensor's bytes)"},
        {[&](nlohmann::json&, NamedTensorList& t) {
           for (auto& [name, tensor] : t) {
             if (name == blob) tensor = tensor.narrow(0, 0, tensor.numel() - 1).contiguous();
           }
         },
         "has 15 bytes of data, its shape [1, 4] needs 16"},
    };
    for (const auto& [edit, expected] : file_cases) {
      CAPTURE(expected);
      nlohmann::json edited_meta = meta;
      NamedTensorList tensors = file.tensors;
      edit(edited_meta, tensors);
      const std::string path = (folder / ("blob" + std::to_string(index++) + ".safetensors")).string();
      save_safetensors(path, tensors, {{"kiln", edited_meta.dump()}});
      Run run(folder / "blob");
      Trainer trainer = run.trainer();
      check_fit_fails(trainer, run, path, expected);
    }
  }
  {  // BatchSizeFinder's saved size: a float was truncated, zero refused only after on_load_checkpoint ran.
    for (const nlohmann::json& size : {nlohmann::json(2.5), nlohmann::json(0), nlohmann::json("4")}) {
      Run run(folder / "bsf");
      Trainer trainer = run.trainer({std::make_shared<BatchSizeFinder>()});
      check_fit_fails(trainer, run, edited(saved, folder, "bsf", [&](nlohmann::json& m) {
                        callback_state(m, "BatchSizeFinder") = {{"optimal_batch_size", size}};
                      }),
                      "callback 'BatchSizeFinder'");
      CHECK(run.train.options().batch_size == 4);
    }
  }
  fs::remove_all(folder);
}

TEST_CASE("Checkpoint validation: a checkpoint that fails to load changes nothing") {
  const fs::path folder = testing::fresh_folder("ckpt_validation", "unchanged");
  const std::string saved = saved_checkpoint(folder);
  // A trainer, callbacks, model and loader with state of their own: a whole
  // fit, and the loader moved on to the middle of an epoch.
  Run run(folder / "own");
  Trainer trainer = run.trainer();
  trainer.fit(run.module, run.train, &run.val);
  run.train.set_epoch(7);
  for (int i = 0; i < 2; ++i) run.train.next();
  const Observed before = observe(trainer, run);
  REQUIRE(before.global_step == 12);
  REQUIRE(before.loader_state.at("position") == 2);
  // Each part fails at another point of the load: the metrics and callback
  // states are checked before anything is applied; the loader and optimizer
  // states only when they load, after the weights, progress and callbacks.
  const std::vector<std::pair<std::string, MetadataEdit>> cases = {
      {"metrics", [](nlohmann::json& m) { m["metrics"]["logged"][0]["count"] = 1.5; }},
      {"early_stopping", [](nlohmann::json& m) { callback_state(m, "EarlyStopping")["wait_count"] = "2"; }},
      {"swa", [](nlohmann::json& m) { callback_state(m, "StochasticWeightAveraging")["swa_started"] = 1; }},
      {"loader_position", [](nlohmann::json& m) { m["loader"]["position"] = 2.5; }},
      {"loader_samples", [](nlohmann::json& m) { m["loader"]["num_samples"] = 17; }},
      {"optimizer", [](nlohmann::json& m) { m["optimizer"]["param_groups"][0]["lr"] = "fast"; }},
      {"schedule", [](nlohmann::json& m) { m["scheduler"]["groups"] = 2; }},
  };
  for (const auto& [name, edit] : cases) {
    CAPTURE(name);
    const std::string path = edited(saved, folder, name, edit);
    CHECK_THROWS_AS(trainer.fit(run.module, run.train, &run.val, path), Error);
    const Observed after = observe(trainer, run);
    CHECK(after.epoch == before.epoch);
    CHECK(after.global_step == before.global_step);
    CHECK(after.callback_metrics == before.callback_metrics);
    for (size_t i = 0; i < before.callback_states.size(); ++i) {
      CHECK_MESSAGE(after.callback_states[i] == before.callback_states[i], trainer.callbacks()[i]->name());
    }
    CHECK(after.loader_state == before.loader_state);
    CHECK(after.weights == before.weights);
  }
  fs::remove_all(folder);
}

TEST_CASE("Checkpoint validation: DataLoader::load_state_dict refuses a float position or a negative epoch") {
  auto data = testing::regression_data(16, 0.1);
  DataLoader loader(data, testing::seeded_loader_options(4));
  loader.next();
  const nlohmann::json own = loader.state_dict();
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& s) { s["position"] = 1.5; }, "\"position\" is 1.5"},
      {[](nlohmann::json& s) { s["position"] = 5; }, "position 5 is outside the epoch's 4 batches"},
      {[](nlohmann::json& s) { s["epoch"] = -1; }, "\"epoch\" is -1"},
      {[](nlohmann::json& s) { s["epoch"] = 2.0; }, "\"epoch\" is 2.0"},
      {[](nlohmann::json& s) { s["seed"] = -7; }, "\"seed\" is -7"},
      {[](nlohmann::json& s) { s["batch_size"] = 4.0; }, "\"batch_size\" is 4.0"},
      {[](nlohmann::json& s) { s["num_samples"] = "16"; }, "\"num_samples\" is \"16\""},
      {[](nlohmann::json& s) { s = nlohmann::json::array(); }, "not a JSON object"},
  };
  for (const auto& [edit, expected] : cases) {
    CAPTURE(expected);
    nlohmann::json state = own;
    state["seed"] = 99;  // the old loader changed its seed before it checked the position
    edit(state);
    CHECK_THROWS_WITH_AS(loader.load_state_dict(state), doctest::Contains(expected.c_str()), Error);
    CHECK(loader.state_dict() == own);
  }
  // The refused loads changed nothing: the next batch is the one a loader without them gives.
  DataLoader reference(data, testing::seeded_loader_options(4));
  reference.next();
  CHECK(loader.next()->input.to_vector<float>() == reference.next()->input.to_vector<float>());
}

TEST_CASE("Checkpoint validation: a callback's refused state leaves its own state unchanged") {
  const fs::path folder = testing::fresh_folder("ckpt_validation", "callbacks");
  EarlyStopping early;
  early.load_state_dict({{"wait_count", 2}, {"best_score", 0.5}, {"stopped_epoch", 1}, {"patience", 4}});
  ModelCheckpointOptions model_checkpoint_options;
  model_checkpoint_options.monitor = "val_loss";
  ModelCheckpoint model_checkpoint(model_checkpoint_options);
  model_checkpoint.load_state_dict({{"best_model_path", "a"}, {"best_k_models", {{"a", 0.5}}}, {"last_saved_step", 3}});
  Timer timer;
  timer.load_state_dict({{"time_elapsed", {{"train", 12.5}}}});
  BatchSizeFinder finder;
  finder.load_state_dict({{"optimal_batch_size", 8}});
  const std::vector<std::pair<Callback*, nlohmann::json>> refused = {
      {&early, {{"wait_count", 3}, {"best_score", 0.25}, {"stopped_epoch", 2}, {"patience", -1}}},
      {&early, {{"wait_count", 3}, {"best_score", 0.25}, {"stopped_epoch", 2.5}}},
      {&model_checkpoint, {{"best_model_path", "b"}, {"best_k_models", {{"b", true}}}}},
      {&model_checkpoint, nlohmann::json::array()},
      {&timer, {{"time_elapsed", {{"train", nullptr}}}}},
      {&finder, {{"optimal_batch_size", -8}}},
  };
  for (const auto& [callback, state] : refused) {
    CAPTURE(state.dump());
    const nlohmann::json before = callback->state_dict();
    CHECK_THROWS_AS(callback->check_state_dict(state), Error);
    CHECK_THROWS_AS(callback->load_state_dict(state), Error);
    CHECK(callback->state_dict() == before);
  }
  CHECK(early.wait_count() == 2);
  CHECK(model_checkpoint.best_model_path() == "a");
  CHECK(timer.time_elapsed() == 12.5);
  CHECK(finder.optimal_batch_size() == 8);
  fs::remove_all(folder);
}

TEST_CASE("Checkpoint validation: saved_json reads only the exact JSON type, in range") {
  nlohmann::json state = nlohmann::json::parse(
      R"({"count": 3, "big": 18446744073709551615, "float": 3.0, "flag": true, "text": "abc"})");
  state["huge"] = INFINITY;  // only in memory: a file's 1e999 does not parse
  constexpr std::string_view where = "test state";
  CHECK(saved_json::integer_at(state, "count", where, 0, 3) == 3);
  CHECK_THROWS_WITH_AS(saved_json::integer_at(state, "count", where, 0, 2),
                       doctest::Contains("test state: \"count\" is 3 (expected an integer in [0, 2])"), Error);
  // An unsigned beyond int64, a float with an integral value and a bool are no int64.
  CHECK_THROWS_WITH_AS(saved_json::integer_at(state, "big", where),
                       doctest::Contains("test state: \"big\" is 18446744073709551615 (expected an integer)"), Error);
  CHECK_THROWS_AS(saved_json::integer_at(state, "float", where), Error);
  CHECK_THROWS_AS(saved_json::integer_at(state, "flag", where), Error);
  CHECK(saved_json::unsigned_integer_at(state, "big", where) == UINT64_MAX);
  // A state made in memory holds non-negative integers as signed ones.
  CHECK(saved_json::unsigned_integer(nlohmann::json(int64_t{7}), "n", where) == 7);
  CHECK_THROWS_AS(saved_json::unsigned_integer(nlohmann::json(int64_t{-7}), "n", where), Error);
  CHECK(saved_json::finite_number_at(state, "count", where) == 3.0);
  CHECK_THROWS_AS(saved_json::finite_number_at(state, "flag", where), Error);
  CHECK_THROWS_AS(saved_json::finite_number_at(state, "huge", where), Error);
  CHECK(saved_json::boolean_at(state, "flag", where));
  CHECK(saved_json::string_at(state, "text", where) == "abc");
  CHECK_THROWS_WITH_AS(saved_json::string_at(state, "missing", where), doctest::Contains("test state: no \"missing\""),
                       Error);
  CHECK_THROWS_AS(saved_json::member(nlohmann::json::array(), "count", where), Error);
  // A long value is cut short in the message.
  const nlohmann::json long_text = std::string(1000, 'x');
  std::string message;
  try {
    saved_json::integer(long_text, "text", where);
  } catch (const Error& error) {
    message = error.message();
  }
  CHECK(message.size() < 200);
  CHECK(message.find("...") != std::string::npos);
}

TEST_CASE("Checkpoint validation: an older checkpoint (no total_batches) whose epoch times the batches per epoch overflows is refused") {
  const fs::path folder = testing::fresh_folder("ckptval", "old_overflow");
  const std::string path = edited(saved_checkpoint(folder), folder, "old", [](nlohmann::json& meta) {
    meta.erase("total_batches");  // files from before it was saved: epoch * batches per epoch + batch
    meta["epoch"] = int64_t{1} << 53;
    meta["loader"] = nullptr;
  });
  Run run(folder / "reader");
  DataLoader many_batches(testing::regression_data(2048, 0.1), testing::seeded_loader_options(1));
  Trainer trainer = run.trainer();
  CHECK_THROWS_WITH_AS(trainer.fit(run.module, many_batches, &run.val, path),
                       doctest::Contains("overflows the batch count"), Error);
  fs::remove_all(folder);
}

TEST_CASE("Checkpoint validation: after a failed resume, the next fit's BatchSizeFinder searches again") {
  const fs::path folder = testing::fresh_folder("ckpt_validation", "bsf_next");
  // BatchSizeFinder's saved size 8 loads (on_load_checkpoint), then the loader's state, saved with 4, refuses it.
  const std::string path = edited(saved_checkpoint(folder), folder, "bsf8", [](nlohmann::json& m) {
    callback_state(m, "BatchSizeFinder") = {{"optimal_batch_size", 8}};
  });
  Run run(folder / "run");
  BatchSizeFinderOptions options;
  options.max_val = 8;
  auto finder = std::make_shared<BatchSizeFinder>(options);
  Trainer trainer = run.trainer({finder});
  CHECK_THROWS_WITH_AS(trainer.fit(run.module, run.train, &run.val, path), doctest::Contains("batch_size"), Error);
  CHECK(run.train.options().batch_size == 4);
  CHECK(trainer.ckpt_path() == path);
  trainer.fit(run.module, run.train, &run.val);  // afresh: the search runs, not the failed resume's size
  CHECK(trainer.ckpt_path().empty());
  REQUIRE(finder->result() != nullptr);
  CHECK_FALSE(finder->result()->trials.empty());
  fs::remove_all(folder);
}
