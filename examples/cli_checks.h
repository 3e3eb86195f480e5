// CLI11 checks for the examples' flags that say plainly what was wanted.
// CLI11's own PositiveNumber/NonNegativeNumber print their range with the
// largest double written out (300 digits), and a bool option given "2" says
// "At Most 1 required but received 2". Header-only, like trainer_flags.h.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <sstream>
#include <string>

namespace kiln::examples {

namespace detail {
inline CLI::Validator number_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        if (zero_allowed ? value >= 0 : value > 0) return {};
        return std::string(zero_allowed ? "must be 0 or more" : "must be greater than 0") + ", got " + text;
      },
      zero_allowed ? "NONNEGATIVE" : "POSITIVE");
}
}  // namespace detail

// Value > 0 / value >= 0, for numeric options (the text must be a number).
inline const CLI::Validator kPositive = detail::number_check(/*zero_allowed=*/false);
inline const CLI::Validator kNonNegative = detail::number_check(/*zero_allowed=*/true);

// low <= value <= high, for a floating option. CLI::Range lets "nan" through
// (it compares false both ways), which then fails deep inside a run.
inline CLI::Validator in_range(double low, double high) {
  std::ostringstream range;
  range << "[" << low << ", " << high << "]";
  return CLI::Validator(
      [low, high, bounds = range.str()](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "expected a number, got '" + text + "'";
        if (value >= low && value <= high) return {};
        return "must be in " + bounds + ", got " + text;
      },
      "in " + range.str());
}

// For bool options given a value ("--pin-memory false"): the words CLI11 reads as a bool.
inline const CLI::Validator kTrueOrFalse = CLI::Validator(
    [](std::string& text) -> std::string {
      for (const char* word : {"true", "false", "1", "0", "on", "off", "yes", "no", "True", "False"}) {
        if (text == word) return {};
      }
      return "expected true or false, got '" + text + "'";
    },
    "true|false");

// For an output file: its folder must exist (checked at parse time, so that a
// typo is refused before training rather than after it).
inline const CLI::Validator kFileInExistingFolder = CLI::Validator(
    [](std::string& text) -> std::string {
      const std::filesystem::path folder = std::filesystem::path(text).parent_path();
      if (text.empty() || folder.empty() || std::filesystem::is_directory(folder)) return {};
      return "folder '" + folder.string() + "' does not exist";
    },
    "");

}  // namespace kiln::examples
