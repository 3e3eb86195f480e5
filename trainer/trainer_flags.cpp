// The Trainer's flags as Lightning resolves them before a run (trainer.h).
#include <algorithm>
#include <cctype>

#include "kernels/error.h"
#include "trainer/trainer.h"

namespace kiln {

namespace {
constexpr int64_t kMaxTimeSeconds = 1'000'000'000;  // about 31 years
}  // namespace

std::chrono::seconds parse_max_time(const std::string& text) {
  int64_t parts[4] = {0, 0, 0, 0};
  int count = 0;
  std::string current;
  for (char c : text + ":") {
    if (c == ':') {
      KILN_CHECK(!current.empty() && count < 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
      int64_t part = 0;
      for (char digit : current) {
        part = part * 10 + (digit - '0');
        // A part over the limit makes max_time over it (and std::stoll threw std::out_of_range past 2^63).
        KILN_CHECK(part <= kMaxTimeSeconds, "max_time: '", text, "' is too long (at most ", kMaxTimeSeconds,
                   " seconds)");
      }
      parts[count++] = part;
      current.clear();
    } else {
      KILN_CHECK(std::isdigit(static_cast<unsigned char>(c)), "max_time: expected \"DD:HH:MM:SS\" or seconds, got '",
                 text, "'");
      current += c;
    }
  }
  KILN_CHECK(count == 1 || count == 4, "max_time: expected \"DD:HH:MM:SS\" or seconds, got '", text, "'");
  // Parts up to 10^9 keep this far below 2^63; the limit keeps the deadline (start + max_time
  // in steady_clock nanoseconds) from overflowing.
  const int64_t seconds = count == 1 ? parts[0] : ((parts[0] * 24 + parts[1]) * 60 + parts[2]) * 60 + parts[3];
  KILN_CHECK(seconds <= kMaxTimeSeconds, "max_time: '", text, "' is too long (at most ", kMaxTimeSeconds,
             " seconds)");
  return std::chrono::seconds(seconds);
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
