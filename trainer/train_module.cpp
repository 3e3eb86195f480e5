#include "trainer/train_module.h"

#include "core/autograd.h"
#include "core/ops.h"

namespace kiln {

void TrainModule::log(const std::string& name, const Tensor& value, std::optional<bool> on_step,
                      std::optional<bool> on_epoch, bool prog_bar, int64_t batch_size) {
  KILN_CHECK(value.defined() && value.numel() == 1, "log('", name, "'): expected a one-element tensor, got ",
             value.defined() ? shape_str(value.shape()) : std::string("an undefined tensor"));
  KILN_CHECK(batch_size > 0, "log('", name, "'): batch_size must be positive, got ", batch_size);
  const bool training = stage_ == "train";
  const std::string& key = name;
  NoGradGuard no_grad;
  Tensor scalar = value.detach().reshape({}).to(DType::f64);
  auto [it, inserted] = logged_.try_emplace(key);
  LoggedValue& entry = it->second;
  if (inserted) order_.push_back(key);
  entry.on_step = on_step.value_or(training);
  entry.on_epoch = on_epoch.value_or(!training);
  entry.prog_bar = prog_bar;
  Tensor weighted = mul(scalar, static_cast<double>(batch_size));
  entry.sum = entry.sum.defined() ? add(entry.sum, weighted) : weighted;
  entry.count += batch_size;
  entry.last = scalar;
}

}  // namespace kiln
