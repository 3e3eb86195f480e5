// train_vit and train_gpt from the command line: short runs end to end, the
// addition task's exact accuracy, a text file's samples, and bad flags refused.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "tests/support/run_binary.h"

namespace fs = std::filesystem;

namespace {

using kiln::testing::BinaryRun;
using kiln::testing::run_built_binary;

fs::path fresh_root(const std::string& name) {
  fs::path root = fs::temp_directory_path() / ("kiln_cli_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(root);
  return root;
}

// The number after `key` in the output, or -1.
double number_after(const std::string& output, const std::string& key) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex(key + " ([0-9.]+)"))) return -1;
  return std::stod(match[1]);
}

}  // namespace

TEST_CASE("train_vit trains a ViT with train_fashion's flags, and refuses bad ones") {
  const fs::path root = fresh_root("vit");
  const BinaryRun run = run_built_binary(
      "train_vit", "--fast-dev-run 2 --num-workers 0 --batch-size 16 --default-root-dir " + root.string());
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("ViT with 456394 parameters") != std::string::npos);
  CHECK(number_after(run.output, "test_acc") >= 0);
  const BinaryRun bad = run_built_binary("train_vit", "--label-smoothing 2 --default-root-dir " + root.string());
  CHECK(bad.exit_code != 0);
  CHECK(bad.output.find("--label-smoothing") != std::string::npos);
  fs::remove_all(root);
}

TEST_CASE("train_gpt learns 2-digit addition well enough to answer held-out problems exactly") {
  const fs::path root = fresh_root("gpt_addition");
  const BinaryRun run = run_built_binary(
      "train_gpt", "--digits 2 --max-steps 700 --max-epochs -1 --batch-size 64 --n-layer 1 --n-embd 128 --lr 3e-3 "
                   "--train-examples 20000 --num-workers 0 --enable-progress-bar false --default-root-dir " +
                       root.string());
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const double accuracy = number_after(run.output, "addition_accuracy");
  MESSAGE("2-digit addition, 700 steps: " << accuracy << " of held-out problems exactly right");
  CHECK(accuracy > 0.5);
  fs::remove_all(root);
}

TEST_CASE("train_gpt models a text file byte by byte and samples from it; GPT-2 names are known") {
  const fs::path root = fresh_root("gpt_text");
  fs::create_directories(root);
  const fs::path text = root / "text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 200; ++i) out << "the quick brown fox jumps over the lazy dog. ";
  }
  const BinaryRun run = run_built_binary(
      "train_gpt", "--data " + text.string() + " --sample 40 --prompt 'the quick' --block-size 32 --max-steps 150 "
                   "--batch-size 16 --n-layer 2 --n-embd 64 --num-workers 0 --enable-progress-bar false "
                   "--default-root-dir " + (root / "runs").string());
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const size_t sample = run.output.find("----- sample -----\nthe quick");
  REQUIRE(sample != std::string::npos);
  // After 150 steps on one repeated sentence, the continuation reproduces it.
  CHECK(run.output.find("brown fox", sample) != std::string::npos);
  const BinaryRun unknown = run_built_binary("train_gpt", "--model gpt5 --default-root-dir " + root.string());
  CHECK(unknown.exit_code != 0);
  CHECK(unknown.output.find("known: gpt2-124m") != std::string::npos);
  const BinaryRun missing = run_built_binary("train_gpt", "--data " + (root / "nope.txt").string() +
                                                              " --default-root-dir " + root.string());
  CHECK(missing.exit_code != 0);
  CHECK(missing.output.find("cannot open") != std::string::npos);
  fs::remove_all(root);
}
