#include "trainer/accumulation_scheduler.h"

#include <string>

#include "trainer/trainer.h"

namespace kiln {

namespace {
std::string describe(const std::map<int64_t, int64_t>& scheduling) {
  std::string text = "{";
  for (const auto& [epoch, factor] : scheduling) {
    text += (text.size() > 1 ? ", " : "") + std::to_string(epoch) + ": " + std::to_string(factor);
  }
  return text + "}";
}
}  // namespace

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

void GradientAccumulationScheduler::on_fit_start(Trainer& trainer, TrainModule&) {
  const TrainerOptions& options = trainer.options();
  KILN_CHECK(options.accumulate_grad_batches == 1, "You set accumulate_grad_batches=",
             options.accumulate_grad_batches, " and are using the GradientAccumulationScheduler; remove one");
  // The Trainer's rule (accumulation_for_epoch) for every epoch where either schedule changes.
  bool same = true;
  int64_t last_key = scheduling_.rbegin()->first;
  if (!options.accumulation_schedule.empty()) last_key = std::max(last_key, options.accumulation_schedule.rbegin()->first);
  for (int64_t epoch = 0; epoch <= last_key; ++epoch) {
    int64_t trainer_factor = options.accumulate_grad_batches;
    for (const auto& [from, factor] : options.accumulation_schedule) {
      if (epoch >= from) trainer_factor = factor;
    }
    same = same && trainer_factor == get_accumulate_grad_batches(epoch);
  }
  KILN_CHECK(same, "GradientAccumulationScheduler: the Trainer runs accumulation_schedule ",
             describe(options.accumulation_schedule), " but this callback schedules ", describe(scheduling_),
             "; the Trainer takes the schedule from TrainerOptions::accumulation_schedule, set it to the callback's");
}

}  // namespace kiln
