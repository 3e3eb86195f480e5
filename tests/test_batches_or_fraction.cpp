// Lightning's int-or-float batch flags: the C++ type decides, as Python's does.
#include <doctest/doctest.h>

#include <limits>

#include "kernels/error.h"
#include "trainer/batches_or_fraction.h"

using kiln::BatchesOrFraction;

TEST_CASE("BatchesOrFraction: integers count batches, floating-point values are fractions") {
  const BatchesOrFraction one = 1, whole_epoch = 1.0, quarter = 0.25, two_as_float = 2.0, seven = int64_t{7};
  CHECK(one.is_count());
  CHECK_FALSE(whole_epoch.is_count());
  CHECK(one.of(10, "x") == 1);
  CHECK(whole_epoch.of(10, "x") == 10);
  CHECK(quarter.of(10, "x") == 2);  // rounded down, as Lightning's int(10 * 0.25)
  CHECK(seven.of(5, "x") == 5);     // a count never exceeds the loader
  // A whole float above 1 is a count (Lightning's _determine_batch_limits).
  CHECK(two_as_float.is_count());
  CHECK(two_as_float == BatchesOrFraction(2));
  CHECK(one.to_string() == "1");
  CHECK(whole_epoch.to_string() == "1.0");
  CHECK(quarter.to_string() == "0.25");
}

TEST_CASE("BatchesOrFraction: parse reads counts and fractions and names bad text") {
  CHECK(BatchesOrFraction::parse("4", "--x") == BatchesOrFraction(4));
  CHECK(BatchesOrFraction::parse("1", "--x").is_count());
  CHECK_FALSE(BatchesOrFraction::parse("1.0", "--x").is_count());
  CHECK(BatchesOrFraction::parse("0.25", "--x") == BatchesOrFraction(0.25));
  CHECK(BatchesOrFraction::parse("2.5e-1", "--x") == BatchesOrFraction(0.25));
  CHECK(BatchesOrFraction::parse("8.0", "--x") == BatchesOrFraction(8));
  for (const char* bad : {"", "abc", "4x", "0.25.1", "1e"}) {
    CAPTURE(bad);
    CHECK_FALSE(BatchesOrFraction::try_parse(bad).has_value());
    CHECK_THROWS_WITH_AS(BatchesOrFraction::parse(bad, "--val-check-interval"),
                         doctest::Contains("--val-check-interval: expected a number of batches"), kiln::Error);
  }
  // Every value's text reads back as the same value.
  for (const BatchesOrFraction value : {BatchesOrFraction(3), BatchesOrFraction(1.0), BatchesOrFraction(0.1),
                                        BatchesOrFraction(0.0), BatchesOrFraction(1e-7)}) {
    CAPTURE(value.to_string());
    CHECK(BatchesOrFraction::parse(value.to_string(), "x") == value);
  }
}

TEST_CASE("BatchesOrFraction: out-of-range values and fractions below one batch are refused") {
  CHECK(BatchesOrFraction(0.5).problem().empty());
  CHECK(BatchesOrFraction(0).problem().empty());
  CHECK(BatchesOrFraction(1000).problem().empty());
  CHECK_THROWS_WITH_AS(BatchesOrFraction(2.5).check("val_check_interval"),
                       doctest::Contains("val_check_interval: invalid value 2.5: it has to be in [0.0, 1.0] or an int"),
                       kiln::Error);
  CHECK_FALSE(BatchesOrFraction(-1).problem().empty());
  CHECK_FALSE(BatchesOrFraction(-0.5).problem().empty());
  CHECK_FALSE(BatchesOrFraction(std::numeric_limits<double>::quiet_NaN()).problem().empty());
  CHECK_THROWS_WITH_AS(BatchesOrFraction(0.05).of(10, "limit_val_batches"),
                       doctest::Contains("try at least limit_val_batches=0.1"), kiln::Error);
  CHECK(BatchesOrFraction(0.0).of(10, "x") == 0);  // 0 turns the loop off, no error
  CHECK(BatchesOrFraction(0.05).of(0, "x") == 0);  // an empty loader is not the fraction's fault
}
