// TensorBoardLogger: the event file is read back by a reader written from the
// format's specification (tests/support/tensorboard_reader.h: TFRecord framing
// with both CRCs, protobuf Event and Summary messages), and, where Python's
// tensorboard module is installed, by TensorBoard's own EventAccumulator
// through scripts/check_tensorboard.py. Images and histograms:
// test_tensorboard_summaries.cpp.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/python_checks.h"
#include "tests/support/tensorboard_reader.h"
#include "tests/support/test_util.h"
#include "trainer/tensorboard_logger.h"

namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kiln-tensorboard-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code error;
    fs::remove_all(path, error);
  }
};

using kiln::testing::crc32c_bitwise;
using kiln::testing::Event;
using kiln::testing::Field;
using kiln::testing::only_event_file;
using kiln::testing::parse_event;
using kiln::testing::parse_message;
using kiln::testing::read_records;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("the reader's CRC-32C gives the standard check value") {
  CHECK(crc32c_bitwise("123456789") == 0xE3069283u);
}

TEST_CASE("TensorBoardLogger uses Lightning's layout and version numbering") {
  TempDir root;
  kiln::TensorBoardLogger first(root.path.string());
  kiln::TensorBoardLogger second(root.path.string());
  CHECK(first.version() == 0);
  CHECK(second.version() == 1);
  CHECK(fs::path(first.log_dir()) == root.path / "lightning_logs" / "version_0");
  CHECK(fs::path(second.log_dir()) == root.path / "lightning_logs" / "version_1");
  const std::string name = fs::path(first.event_file()).filename().string();
  INFO("event file name: " << name);
  const std::regex pattern(R"(events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.(\d+))");
  std::smatch match;
  REQUIRE(std::regex_match(name, match, pattern));
  CHECK(std::abs(std::stod(match[1].str()) - now_seconds()) < 120);
  CHECK(std::stol(match[3].str()) == static_cast<long>(::getpid()));
  CHECK(only_event_file(first.log_dir()) == first.event_file());
  // An explicit version (CSVLogger's) shares that folder.
  kiln::TensorBoardLogger shared(root.path.string(), "lightning_logs", 0);
  CHECK(shared.log_dir() == first.log_dir());
  CHECK(shared.event_file() != first.event_file());
  kiln::TensorBoardLogger named(root.path.string(), "my_experiment");
  CHECK(fs::path(named.log_dir()) == root.path / "my_experiment" / "version_0");
}

TEST_CASE("TensorBoardLogger makes its folder and event file at first use, as Lightning's") {
  TempDir root;
  { kiln::TensorBoardLogger unused(root.path.string()); }
  CHECK(fs::is_empty(root.path));  // a program that fails before it logs leaves nothing
  kiln::TensorBoardLogger first(root.path.string()), second(root.path.string());
  CHECK(fs::is_empty(root.path));
  second.log_metrics({{"loss", 1.0}}, 1, 0);  // the first one used claims version_0
  second.save();
  CHECK(second.version() == 0);
  CHECK(first.version() == 1);
  CHECK(fs::is_directory(root.path / "lightning_logs" / "version_1"));
  const std::vector<Event> events = kiln::testing::read_events(second.event_file());
  REQUIRE(events.size() == 2);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[1].scalars.at("loss") == 1.0f);
  CHECK(kiln::testing::error_of([&] { kiln::TensorBoardLogger refused(root.path.string(), "x", -1); })
            .find("version must be >= 0, got -1") != std::string::npos);
}

TEST_CASE("TensorBoardLogger writes framed Event records that read back exactly") {
  TempDir root;
  kiln::TensorBoardLogger logger(root.path.string());
  const double before = now_seconds();
  logger.log_metrics({{"train_loss", 2.5}, {"lr", 0.1}}, 0, 0);
  logger.log_metrics({{"train_loss", 1.25}, {"lr", 0.01}}, 7, 0);
  logger.log_metrics({{"val_loss", -3.0e-4}}, 123456789012LL, 3);
  logger.save();
  const double after = now_seconds();

  const std::vector<std::string> records = read_records(logger.event_file());
  REQUIRE(records.size() == 4);
  const Event header = parse_event(records[0]);
  CHECK(header.file_version == "brain.Event:2");
  CHECK(header.scalars.empty());

  const Event first = parse_event(records[1]), second = parse_event(records[2]), third = parse_event(records[3]);
  CHECK(first.step == 0);
  CHECK(second.step == 7);
  CHECK(third.step == 123456789012LL);
  CHECK(first.scalars == std::map<std::string, float>{{"train_loss", 2.5f}, {"lr", 0.1f}, {"epoch", 0.f}});
  CHECK(second.scalars == std::map<std::string, float>{{"train_loss", 1.25f}, {"lr", 0.01f}, {"epoch", 0.f}});
  CHECK(third.scalars == std::map<std::string, float>{{"val_loss", -3.0e-4f}, {"epoch", 3.f}});
  for (const Event& event : {header, first, second, third}) {
    CHECK(event.wall_time >= before - 1);
    CHECK(event.wall_time <= after + 1);
  }
  CHECK(first.wall_time <= second.wall_time);
}

TEST_CASE("TensorBoardLogger only appends: what save() wrote is a prefix of every later file") {
  TempDir root;
  kiln::TensorBoardLogger logger(root.path.string());
  logger.log_metrics({{"loss", 1.0}}, 1, 0);
  logger.save();
  std::ifstream early_in(logger.event_file(), std::ios::binary);
  const std::string early((std::istreambuf_iterator<char>(early_in)), std::istreambuf_iterator<char>());
  logger.log_metrics({{"loss", 0.5}}, 2, 0);
  logger.log_hyperparams({{"lr", "0.1"}});
  logger.save();
  std::ifstream late_in(logger.event_file(), std::ios::binary);
  const std::string late((std::istreambuf_iterator<char>(late_in)), std::istreambuf_iterator<char>());
  REQUIRE(late.size() > early.size());
  CHECK(late.compare(0, early.size(), early) == 0);

  // A crash mid-record leaves the whole records before it readable.
  const fs::path cut = root.path / "cut.tfevents";
  std::ofstream(cut, std::ios::binary) << late.substr(0, late.size() - 5);
  size_t whole_bytes = 0;
  const std::vector<std::string> records = read_records(cut.string(), &whole_bytes);
  CHECK(records.size() == 3);
  CHECK(whole_bytes < late.size() - 5);
  CHECK(parse_event(records[2]).scalars.at("loss") == 0.5f);
}

TEST_CASE("TensorBoardLogger writes hparams.yaml and an hparams-plugin summary") {
  TempDir root;
  kiln::TensorBoardLogger logger(root.path.string());
  logger.log_hyperparams({{"lr", "0.001"}, {"optimizer", "adam"}, {"nesterov", "true"}, {"precision", "32-true"}});
  logger.save();
  CHECK(read_text(fs::path(logger.log_dir()) / "hparams.yaml") ==
        "lr: 0.001\nnesterov: true\noptimizer: adam\nprecision: 32-true\n");

  const std::vector<std::string> records = read_records(logger.event_file());
  REQUIRE(records.size() == 2);
  const Event event = parse_event(records[1]);
  REQUIRE(event.other_values.size() == 1);
  std::string tag, metadata;
  for (const Field& field : parse_message(event.other_values[0])) {
    if (field.number == 1) tag = field.bytes;
    if (field.number == 9) metadata = field.bytes;
  }
  CHECK(tag == "_hparams_/session_start_info");
  // SummaryMetadata.plugin_data { plugin_name, content = HParamsPluginData }.
  REQUIRE(parse_message(metadata).size() == 1);
  const std::vector<Field> plugin = parse_message(parse_message(metadata)[0].bytes);
  REQUIRE(plugin.size() == 2);
  CHECK(plugin[0].bytes == "hparams");
  const std::vector<Field> plugin_data = parse_message(plugin[1].bytes);
  REQUIRE(plugin_data.size() == 1);
  CHECK(plugin_data[0].number == 3);  // session_start_info
  std::map<std::string, Field> values;  // key -> the google.protobuf.Value's one field
  for (const Field& field : parse_message(plugin_data[0].bytes)) {
    if (field.number != 1) continue;
    const std::vector<Field> entry = parse_message(field.bytes);
    REQUIRE(entry.size() == 2);
    values[entry[0].bytes] = parse_message(entry[1].bytes).at(0);
  }
  REQUIRE(values.size() == 4);
  CHECK(values["lr"].number == 2);
  CHECK(kiln::testing::as_double(values["lr"].bits) == 0.001);
  CHECK(values["optimizer"].number == 3);
  CHECK(values["optimizer"].bytes == "adam");
  CHECK(values["nesterov"].number == 4);
  CHECK(values["nesterov"].bits == 1);
  CHECK(values["precision"].number == 3);
  CHECK(values["precision"].bytes == "32-true");
}

TEST_CASE("TensorBoard's own reader reads kiln's event file") {
  const fs::path script = kiln::testing::source_root() / "scripts" / "check_tensorboard.py";
  REQUIRE(fs::exists(script));
  const std::string python =
      kiln::testing::require_python("tensorboard", "KILN_TENSORBOARD_PYTHON", "TensorBoard's own reader");
  if (python.empty()) return;
  TempDir root;
  {
    kiln::TensorBoardLogger logger(root.path.string());
    logger.log_hyperparams({{"lr", "0.001"}, {"optimizer", "adam"}, {"nesterov", "true"}});
    logger.log_metrics({{"train_loss", 2.5}}, 0, 0);
    logger.log_metrics({{"train_loss", 1.25}, {"val_acc", 0.75}}, 10, 1);
    logger.log_metrics({{"train_loss", 0.1}}, 20, 2);
    logger.save();
  }
  const std::string expected =
      R"({"scalars": {"train_loss": [[0, 2.5], [10, 1.25], [20, 0.1]], "val_acc": [[10, 0.75]],)"
      R"( "epoch": [[0, 0], [10, 1], [20, 2]]}, "hparams": {"lr": 0.001, "optimizer": "adam", "nesterov": true}})";
  const std::string command = python + " " + script.string() + " " +
                              (root.path / "lightning_logs" / "version_0").string() + " '" + expected + "'";
  const kiln::testing::BinaryRun run = kiln::testing::run_shell(command);
  MESSAGE("check_tensorboard.py:\n" << run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("tensorboard check: OK") != std::string::npos);
}
