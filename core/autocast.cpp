// Autocast: the per-thread state, the cast plans of the three policies and the
// weight cache (semantics in core/autocast.h).
#include "core/autocast.h"

#include <map>
#include <span>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"

namespace kiln {

namespace {

struct DeviceState {
  bool enabled = false;
  DType dtype;
};

struct CacheEntry {
  Tensor source;     // keeps the key's TensorImpl alive, so its address cannot be reused meanwhile
  uint64_t version;  // the source's version when it was cast
  Tensor cast;
};

struct AutocastState {
  DeviceState cpu{false, DType::bf16};
  DeviceState cuda{false, DType::f16};
  bool cache_enabled = true;
  int nesting = 0;  // live guards; the cache is cleared when the last one exits
  std::map<std::pair<const TensorImpl*, DType>, CacheEntry> cache;

  DeviceState& of(DeviceType device) { return device == DeviceType::cpu ? cpu : cuda; }
};

thread_local AutocastState state;

bool is_16_bit(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

// The dtype both operands of a mixed floating op run in (torch.promote_types
// for floats: float64 wins, otherwise float32, also for float16 with bfloat16).
DType promote_floating(DType a, DType b) {
  if (a == b) return a;
  return a == DType::f64 || b == DType::f64 ? DType::f64 : DType::f32;
}

// A float32 parameter cast to `dtype`, through the cache of the current region.
Tensor cached_lower_precision_cast(const Tensor& x, DType dtype) {
  const bool cacheable = state.cache_enabled && state.nesting > 0 && x.dtype() == DType::f32 && x.is_leaf() &&
                         x.requires_grad();
  if (!cacheable) return cast(x, dtype);
  const std::pair<const TensorImpl*, DType> key{x.impl(), dtype};
  auto it = state.cache.find(key);
  // A cast made under no_grad has no graph node: it cannot serve a use that needs a gradient.
  if (it != state.cache.end() && it->second.version == x.version() &&
      (it->second.cast.grad_fn() != nullptr || !grad_mode_enabled())) {
    return it->second.cast;
  }
  Tensor out = cast(x, dtype);
  state.cache.insert_or_assign(key, CacheEntry{x, x.version(), out});
  return out;
}

}  // namespace

bool autocast_enabled(DeviceType device) { return state.of(device).enabled; }
DType autocast_dtype(DeviceType device) { return state.of(device).dtype; }

AutocastGuard::AutocastGuard(DeviceType device, DType dtype, bool enabled, bool cache_enabled) : device_(device) {
  if (enabled) {
    KILN_CHECK(is_16_bit(dtype), "autocast: the dtype must be float16 or bfloat16, got ", dtype_name(dtype));
    KILN_CHECK(!(device == DeviceType::cpu && dtype == DType::f16),
               "autocast: float16 on the CPU is not supported: float16 mixed precision (\"16-mixed\") needs a GPU; "
               "use bfloat16 (\"bf16-mixed\") on the CPU");
  }
  DeviceState& current = state.of(device);
  previous_enabled_ = current.enabled;
  previous_dtype_ = current.dtype;
  previous_cache_enabled_ = state.cache_enabled;
  current.enabled = enabled;
  if (enabled) current.dtype = dtype;
  state.cache_enabled = cache_enabled;
  ++state.nesting;
}

AutocastGuard::~AutocastGuard() {
  if (--state.nesting == 0) state.cache.clear();
  DeviceState& current = state.of(device_);
  current.enabled = previous_enabled_;
  current.dtype = previous_dtype_;
  state.cache_enabled = previous_cache_enabled_;
}

namespace autocast {

namespace {
Cast plan_of(Policy policy, std::span<const Tensor* const> inputs) {
  Cast result{policy, DType::f32, false};
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (t->defined()) {
      first = t;
      break;
    }
  }
  if (first == nullptr) return result;
  const DeviceState& device = state.of(first->device().type);
  if (!device.enabled) return result;
  bool have_floating = false;
  for (const Tensor* t : inputs) {
    if (!t->defined() || !is_floating(t->dtype())) continue;
    const DType dtype = t->dtype();
    switch (policy) {
      case Policy::lower_precision:
        result.dtype = device.dtype;
        result.active = result.active || (dtype != DType::f64 && dtype != device.dtype);
        break;
      case Policy::float32:
        result.active = result.active || is_16_bit(dtype);
        break;
      case Policy::promote:
        if (have_floating && dtype != result.dtype) result.active = true;
        result.dtype = have_floating ? promote_floating(result.dtype, dtype) : dtype;
        break;
    }
    have_floating = true;
  }
  return result;
}
}  // namespace

Cast plan(Policy policy, std::initializer_list<const Tensor*> inputs) {
  return plan_of(policy, std::span<const Tensor* const>(inputs.begin(), inputs.size()));
}

Cast plan(Policy policy, const std::vector<Tensor>& inputs) {
  std::vector<const Tensor*> pointers;
  pointers.reserve(inputs.size());
  for (const Tensor& t : inputs) pointers.push_back(&t);
  return plan_of(policy, pointers);
}

Tensor Cast::operator()(const Tensor& x) const {
  if (!x.defined() || !is_floating(x.dtype()) || x.dtype() == dtype) return x;
  switch (policy) {
    case Policy::lower_precision:
      return x.dtype() == DType::f64 ? x : cached_lower_precision_cast(x, dtype);
    case Policy::float32:
      return is_16_bit(x.dtype()) ? cast(x, DType::f32) : x;
    case Policy::promote:
      return cast(x, dtype);
  }
  return x;
}

size_t weight_cache_size() { return state.cache.size(); }

}  // namespace autocast

}  // namespace kiln
