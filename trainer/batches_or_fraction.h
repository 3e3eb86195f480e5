// Lightning's `Union[int, float]` batch flags (limit_train/val/test_batches,
// val_check_interval, overfit_batches). The C++ type of the value decides, as
// the Python type does in Lightning: an integer is a number of batches, a
// floating-point value in [0, 1] a fraction of the epoch's batches, and a
// whole floating-point value above 1 a number of batches again (Lightning's
// _determine_batch_limits). So `1` means one batch and `1.0` the whole epoch:
//
//   options.val_check_interval = 1;     // validate after every batch
//   options.val_check_interval = 1.0;   // once per epoch (the default)
//   options.limit_train_batches = 0.25; // a quarter of the epoch
#pragma once

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

class BatchesOrFraction {
 public:
  template <std::integral Integer>
    requires(!std::same_as<Integer, bool>)
  constexpr BatchesOrFraction(Integer batches) : value_(static_cast<double>(batches)), is_count_(true) {}
  template <std::floating_point Floating>
  constexpr BatchesOrFraction(Floating value)
      : value_(static_cast<double>(value)), is_count_(is_whole_above_one(value_)) {}

  // "4" is a count; "0.25", "1.0", "2.5e-1" are floating-point values.
  // Anything else (empty, trailing characters): nullopt from try_parse, a
  // kiln::Error naming `name` from parse.
  static std::optional<BatchesOrFraction> try_parse(std::string_view text);
  // What parse says, before the text, of text it cannot read.
  static constexpr std::string_view kExpected =
      "expected a number of batches (like 4) or a fraction of an epoch (like 0.25)";
  static BatchesOrFraction parse(std::string_view text, std::string_view name);

  bool is_count() const { return is_count_; }
  double value() const { return value_; }
  bool positive() const { return value_ > 0; }
  // Empty when the value is a count >= 0 or a fraction in [0, 1], else what is
  // wrong (Lightning: "it has to be in [0.0, 1.0] or an int"); check throws
  // that as a kiln::Error naming `name`.
  std::string problem() const;
  void check(std::string_view name) const;
  // The batches out of `available`: min(count, available), or
  // floor(fraction * available). A positive fraction that leaves no batch of a
  // non-empty loader throws, saying which fraction would give one (Lightning's
  // "Try at least limit_val_batches=...").
  int64_t of(int64_t available, std::string_view name) const;
  // "4" for a count, "0.25" / "1.0" for a fraction: parse() reads it back.
  std::string to_string() const;

  bool operator==(const BatchesOrFraction&) const = default;

 private:
  static constexpr bool is_whole_above_one(double value) {
    return value > 1 && value < 9e18 && value == static_cast<double>(static_cast<int64_t>(value));
  }

  double value_;
  bool is_count_;
};

}  // namespace kiln
