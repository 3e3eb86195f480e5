// The device error slot after an emulated indexing launch, as test_indexing.cpp
// and test_index_add.cpp check it: with out-of-range indices it holds one of
// them and the indexed size, without them nothing; reading it cleared it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kernels/indexing.h"

// Whether `error` (the slot's first read) and `cleared` (its second) are as
// `bad_values` (the out-of-range indices given) say; prints what is not.
inline bool error_slot_ok(const char* label, const kiln::kernels::IndexError& error,
                          const kiln::kernels::IndexError& cleared, const std::vector<int64_t>& bad_values,
                          int64_t size) {
  const bool flag_ok = bad_values.empty() ? !error.found
                                          : error.found && error.size == size &&
                                                std::find(bad_values.begin(), bad_values.end(), error.value) != bad_values.end();
  if (flag_ok && !cleared.found) return true;
  std::printf("FAIL %s: error slot found %d value %ld size %ld (then %d)\n", label, error.found,
              static_cast<long>(error.value), static_cast<long>(error.size), cleared.found);
  return false;
}
