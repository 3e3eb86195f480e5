// GradientAccumulationScheduler: accumulate k batches per optimizer step from
// a given (0-based) epoch on, as Lightning's callback: scheduling = {4: 2}
// accumulates 2 batches from the fifth epoch; epochs before the first key
// accumulate 1.
#pragma once

#include <map>

#include "trainer/callbacks.h"

namespace kiln {

class GradientAccumulationScheduler : public Callback {
 public:
  // Throws kiln::Error (Lightning's checks) for an empty schedule, a negative
  // epoch or a factor below 1.
  explicit GradientAccumulationScheduler(std::map<int64_t, int64_t> scheduling);
  std::string name() const override { return "GradientAccumulationScheduler"; }

  // The Trainer applies the schedule itself (TrainerOptions::accumulation_schedule):
  // this checks that it runs this schedule, and that accumulate_grad_batches
  // is left at 1 (Lightning refuses both at once).
  void on_fit_start(Trainer& trainer, TrainModule& module) override;

  int64_t get_accumulate_grad_batches(int64_t epoch) const;
  // The schedule with {0: 1} added when it starts later (Lightning's normal form).
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace kiln
