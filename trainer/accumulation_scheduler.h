// GradientAccumulationScheduler: accumulate k batches per optimizer step from
// a given (0-based) epoch on, as Lightning's callback: scheduling = {4: 2}
// accumulates 2 batches from the fifth epoch; epochs before the first key
// accumulate 1. The Trainer's constructor takes the schedule from the callback
// into TrainerOptions::accumulation_schedule (so estimated_stepping_batches
// counts it), and refuses it together with accumulate_grad_batches != 1 or
// another accumulation_schedule (Lightning refuses both at once).
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

  int64_t get_accumulate_grad_batches(int64_t epoch) const;
  // The schedule with {0: 1} added when it starts later (Lightning's normal form).
  const std::map<int64_t, int64_t>& scheduling() const { return scheduling_; }

 private:
  std::map<int64_t, int64_t> scheduling_;
};

}  // namespace kiln
