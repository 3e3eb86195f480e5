#include "trainer/tensorboard_histograms.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>
#include <vector>

#include "kernels/error.h"
#include "optim/optimizer.h"
#include "trainer/tensorboard_logger.h"
#include "trainer/trainer.h"

namespace kiln {

TensorBoardHistograms::TensorBoardHistograms(int64_t every_n_steps) : every_n_steps_(every_n_steps) {
  KILN_CHECK(every_n_steps >= 1, "TensorBoardHistograms: every_n_steps must be >= 1, got ", every_n_steps);
}

void TensorBoardHistograms::on_fit_start(Trainer& trainer, TrainModule&) {
  logger_ = find_tensorboard_logger(trainer);
  logged_window_.clear();
  if (logger_ != nullptr || !trainer.is_global_zero() || said_no_logger_) return;
  said_no_logger_ = true;
  std::fprintf(stderr, "TensorBoardHistograms: %s; no histograms are written\n",
               trainer.options().fast_dev_run > 0 ? "fast_dev_run turns logging off"
               : !trainer.options().logger        ? "logging is off (logger false)"
                                                  : "the Trainer has no TensorBoardLogger among its loggers");
}

void TensorBoardHistograms::on_before_optimizer_step(Trainer& trainer, TrainModule& module,
                                                     optim::Optimizer& optimizer) {
  if (logger_ == nullptr) return;
  const int64_t step = trainer.global_step();
  const int64_t window = step / every_n_steps_;
  const auto [logged, first] = logged_window_.try_emplace(&optimizer, window);
  if (!first && logged->second == window) return;
  logged->second = window;

  std::unordered_set<const TensorImpl*> stepped;  // the parameters this optimizer updates
  for (int64_t group = 0; group < optimizer.num_groups(); ++group) {
    for (const Tensor& parameter : optimizer.params(group)) stepped.insert(parameter.impl());
  }
  // A value that is NaN or inf would make log_histogram throw; training goes on without that histogram.
  auto log_finite = [&](const std::string& tag, const Tensor& tensor) {
    // To the host first: a float64 copy made on the device would double (bfloat16: quadruple) the memory.
    const std::vector<double> values = tensor.detach().cpu().to(DType::f64).contiguous().to_vector<double>();
    if (std::all_of(values.begin(), values.end(), [](double v) { return std::isfinite(v); })) {
      logger_->log_histogram(tag, values, step);
    } else if (!said_non_finite_) {
      said_non_finite_ = true;
      std::fprintf(stderr,
                   "TensorBoardHistograms: %s holds NaN or inf at step %lld (a gradient of a step the grad scaler "
                   "skips, or a diverged run); histograms with such values are left out\n",
                   tag.c_str(), static_cast<long long>(step));
    }
  };
  for (const auto& [name, parameter] : module.model().named_parameters()) {
    if (stepped.count(parameter.impl()) == 0 || parameter.numel() == 0) continue;
    log_finite("weights/" + name, parameter);
    const Tensor grad = parameter.grad();
    if (grad.defined()) log_finite("grads/" + name, grad);  // undefined: not reached by this step's backward
  }
}

}  // namespace kiln
