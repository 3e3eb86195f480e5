#include "trainer/accumulation_scheduler.h"

#include <iterator>

#include "kernels/error.h"

namespace kiln {

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  KILN_CHECK(!scheduling_.empty(), "GradientAccumulationScheduler: an empty scheduling cannot be interpreted");
  for (const auto& [epoch, factor] : scheduling_) {
    KILN_CHECK(epoch >= 0, "GradientAccumulationScheduler: epochs are 0-based, got epoch ", epoch);
    KILN_CHECK(factor >= 1, "GradientAccumulationScheduler: the accumulation factor must be >= 1, got ", factor,
               " for epoch ", epoch);
  }
  scheduling_.emplace(0, 1);  // no-op when epoch 0 is scheduled
}

int64_t GradientAccumulationScheduler::get_accumulate_grad_batches(int64_t epoch) const {
  auto it = scheduling_.upper_bound(epoch);  // the last key <= epoch
  return it == scheduling_.begin() ? 1 : std::prev(it)->second;
}

}  // namespace kiln
