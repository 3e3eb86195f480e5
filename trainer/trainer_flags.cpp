// The Trainer's flags as Lightning resolves them before a run (trainer.h).
#include <algorithm>
#include <cctype>

#include "kernels/error.h"
#include "trainer/trainer.h"

namespace kiln {

std::chrono::seconds parse_max_time(const std::string& text) {
  int64_t parts[4] = {0, 0, 0, 0};
  int count = 0;
  std::string current;
  for (char c : text + ":") {
    if (c == ':') {
      KILN_CHECK(!current.empty() && count < 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
      parts[count++] = std::stoll(current);
      current.clear();
    } else {
      KILN_CHECK(std::isdigit(static_cast<unsigned char>(c)), "max_time: expected \"DD:HH:MM:SS\" or seconds, got '",
                 text, "'");
      current += c;
    }
  }
  if (count == 1) return std::chrono::seconds(parts[0]);
  KILN_CHECK(count == 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
  return std::chrono::seconds(((parts[0] * 24 + parts[1]) * 60 + parts[2]) * 60 + parts[3]);
}

void resolve_trainer_flags(TrainerOptions& options) {
  // Lightning's _configure_checkpoint_callbacks.
  const bool has_checkpoint_callback =
      std::any_of(options.callbacks.begin(), options.callbacks.end(),
                  [](const auto& callback) { return dynamic_cast<const ModelCheckpoint*>(callback.get()); });
  KILN_CHECK(options.enable_checkpointing || !has_checkpoint_callback, "Trainer was configured with "
             "enable_checkpointing=false but found a ModelCheckpoint in its callbacks; remove one");
  // ... and without one, enable_checkpointing adds ModelCheckpoint() (the latest checkpoint, in
  // <log dir>/checkpoints, or <default_root_dir>/checkpoints without a logger).
  if (options.enable_checkpointing && !has_checkpoint_callback) {
    options.callbacks.push_back(std::make_shared<ModelCheckpoint>());
  }
  // Lightning's _init_debugging_flags: the limits themselves stay in Trainer::limit.
  if (options.fast_dev_run > 0) {
    options.max_steps = options.fast_dev_run;
    options.num_sanity_val_steps = 0;
    options.val_check_interval = 1.0;
    options.check_val_every_n_epoch = 1;
  }
}

}  // namespace kiln
