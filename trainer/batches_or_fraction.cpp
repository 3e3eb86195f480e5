#include "trainer/batches_or_fraction.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "kernels/error.h"

namespace kiln {

std::optional<BatchesOrFraction> BatchesOrFraction::try_parse(std::string_view text) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  // As Python's int/float literals decide Lightning's type: a decimal point,
  // an exponent, inf or nan make a floating-point value.
  const bool floating = text.find_first_of(".eEiInN") != std::string_view::npos;
  if (!floating) {
    int64_t batches = 0;
    auto [end, error] = std::from_chars(first, last, batches);
    if (text.empty() || error != std::errc() || end != last) return std::nullopt;
    return BatchesOrFraction(batches);
  }
  double value = 0;
  auto [end, error] = std::from_chars(first, last, value);
  if (error != std::errc() || end != last) return std::nullopt;
  return BatchesOrFraction(value);
}

BatchesOrFraction BatchesOrFraction::parse(std::string_view text, std::string_view name) {
  const std::optional<BatchesOrFraction> parsed = try_parse(text);
  KILN_CHECK(parsed.has_value(), name, ": ", kExpected, ", got '", text, "'");
  return *parsed;
}

std::string BatchesOrFraction::problem() const {
  if (std::isfinite(value_) && value_ >= 0 && (is_count_ || value_ <= 1)) return {};
  return "invalid value " + to_string() + ": it has to be in [0.0, 1.0] or an int";
}

void BatchesOrFraction::check(std::string_view name) const {
  const std::string what = problem();
  KILN_CHECK(what.empty(), "Trainer: ", name, ": ", what);
}

int64_t BatchesOrFraction::of(int64_t available, std::string_view name) const {
  if (is_count_) return std::min(static_cast<int64_t>(value_), available);
  const auto batches = static_cast<int64_t>(std::floor(value_ * static_cast<double>(available)));
  KILN_CHECK(batches > 0 || value_ == 0 || available == 0, "Trainer: ", name, "=", to_string(), " of ", available,
             " batches is less than one batch. Please increase ", name, "; try at least ", name, "=",
             1.0 / static_cast<double>(available));
  return batches;
}

std::string BatchesOrFraction::to_string() const {
  if (is_count_) return std::to_string(static_cast<int64_t>(value_));
  char text[32];
  std::snprintf(text, sizeof text, "%g", value_);
  std::string result = text;
  // A fraction always shows as floating point ("1.0", not "1", which is a count).
  if (result.find_first_of(".eEiInN") == std::string::npos) result += ".0";
  return result;
}

}  // namespace kiln
