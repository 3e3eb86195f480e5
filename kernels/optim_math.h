// The per-element arithmetic of the optimizers, shared by the CPU kernels
// (kernels/cpu/optim.cpp) and the CUDA kernels (kernels/cuda/optim.cu) so that
// both devices run the same update. C is the compute type: float for
// f32/f16/bf16 params, double for f64 params. Per-tensor scalars (bias
// corrections, step sizes) are formed in double from the device-resident
// values, then rounded to C once per tensor.
//
// Formulas (PyTorch's documented updates; g already multiplied by the clip
// coefficient, and negated when maximizing):
//   SGD:   g += wd*p; b = (first ? g : mu*b + (1-dampening)*g); g = nesterov ? g + mu*b : b; p -= lr*g
//   Adam:  g += wd*p (AdamW instead: p *= 1 - lr*wd); m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
//          vmax = max(vmax, v) (amsgrad); p -= lr/bc1 * m / (sqrt(v or vmax)/sqrt(bc2) + eps)
//   LAMB:  (You et al. 2019, decoupled weight decay as apex FusedLAMB's default mode)
//          m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; u = (m/bc1) / (sqrt(v/bc2) + eps) + wd*p;
//          p -= lr * (|p| > 0 && |u| > 0 ? |p|/|u| : 1) * u       (norms per tensor; every tensor adapts)
//   LARS:  (You et al. 2017 as in apex LARC, scale mode)
//          if |p| > 0 and |g| > 0: g = (g + wd*p) * tc*|p| / (|g| + wd*|p| + eps)
//          b = (first ? g : mu*b + g); p -= lr*b   (without momentum: p -= lr*g)
#pragma once

#include <math.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/optim.h"

namespace kiln::kernels::optim_math {

// The element functions are branch-free in the options (maximize folds into
// the gradient multiplier's sign, an absent weight decay is a factor of 1 or a
// term of 0, both exact for finite values) so that the CPU loops vectorize.

// ---------------------------------------------------------------- SGD
template <typename C>
struct SgdScalars {
  C lr, momentum, one_minus_dampening, weight_decay, grad_multiplier;
  bool first;     // the momentum buffer is created from this gradient
  bool nesterov;
};

template <typename C>
KILN_HOST_DEVICE inline SgdScalars<C> sgd_scalars(const SgdConfig& config, double lr, double momentum, int64_t step,
                                                  double grad_scale) {
  SgdScalars<C> s;
  s.lr = static_cast<C>(lr);
  s.momentum = static_cast<C>(momentum);
  s.one_minus_dampening = static_cast<C>(1.0 - config.dampening);
  s.weight_decay = static_cast<C>(config.weight_decay);
  s.grad_multiplier = static_cast<C>(config.maximize ? -grad_scale : grad_scale);
  s.first = step <= 1;
  s.nesterov = config.nesterov;
  return s;
}

// buf is null without momentum.
template <typename C>
KILN_HOST_DEVICE inline void sgd_element(C& p, C g, C* buf, const SgdScalars<C>& s) {
  g = g * s.grad_multiplier + s.weight_decay * p;
  if (buf != nullptr) {
    const C b = s.first ? g : s.momentum * *buf + s.one_minus_dampening * g;
    *buf = b;
    g = s.nesterov ? g + s.momentum * b : b;
  }
  p -= s.lr * g;
}

// ---------------------------------------------------------------- Adam / AdamW
template <typename C>
struct AdamScalars {
  C one_minus_beta1, beta2, one_minus_beta2, eps, l2_decay, decay_factor, step_size, bias_correction2_sqrt,
      grad_multiplier;
};

template <typename C>
KILN_HOST_DEVICE inline AdamScalars<C> adam_scalars(const AdamConfig& config, double lr, double beta1, int64_t step,
                                                    double grad_scale) {
  const double t = static_cast<double>(step);
  AdamScalars<C> s;
  s.one_minus_beta1 = static_cast<C>(1.0 - beta1);
  s.beta2 = static_cast<C>(config.beta2);
  s.one_minus_beta2 = static_cast<C>(1.0 - config.beta2);
  s.eps = static_cast<C>(config.eps);
  s.l2_decay = static_cast<C>(config.decoupled_weight_decay ? 0.0 : config.weight_decay);
  s.decay_factor = static_cast<C>(config.decoupled_weight_decay ? 1.0 - lr * config.weight_decay : 1.0);
  s.step_size = static_cast<C>(lr / (1.0 - ::pow(beta1, t)));
  s.bias_correction2_sqrt = static_cast<C>(::sqrt(1.0 - ::pow(config.beta2, t)));
  s.grad_multiplier = static_cast<C>(config.maximize ? -grad_scale : grad_scale);
  return s;
}

// vmax is null without amsgrad.
template <typename C>
KILN_HOST_DEVICE inline void adam_element(C& p, C g, C& m, C& v, C* vmax, const AdamScalars<C>& s) {
  p *= s.decay_factor;                             // AdamW (1 otherwise)
  g = g * s.grad_multiplier + s.l2_decay * p;      // Adam's L2 term (0 otherwise)
  m += s.one_minus_beta1 * (g - m);                // torch.lerp with weight < 0.5
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  C second = v;
  if (vmax != nullptr) {
    *vmax = *vmax < v ? v : *vmax;
    second = *vmax;
  }
  const C denom = ::sqrt(second) / s.bias_correction2_sqrt + s.eps;
  p -= s.step_size * m / denom;
}

// ---------------------------------------------------------------- LAMB
template <typename C>
struct LambScalars {
  C beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, inv_bias_correction1, inv_bias_correction2,
      grad_scale;
};

template <typename C>
KILN_HOST_DEVICE inline LambScalars<C> lamb_scalars(const LambConfig& config, double beta1, int64_t step,
                                                    double grad_scale) {
  const double t = static_cast<double>(step);
  LambScalars<C> s;
  s.beta1 = static_cast<C>(beta1);
  s.one_minus_beta1 = static_cast<C>(1.0 - beta1);
  s.beta2 = static_cast<C>(config.beta2);
  s.one_minus_beta2 = static_cast<C>(1.0 - config.beta2);
  s.eps = static_cast<C>(config.eps);
  s.weight_decay = static_cast<C>(config.weight_decay);
  s.inv_bias_correction1 = static_cast<C>(config.bias_correction ? 1.0 / (1.0 - ::pow(beta1, t)) : 1.0);
  s.inv_bias_correction2 = static_cast<C>(config.bias_correction ? 1.0 / (1.0 - ::pow(config.beta2, t)) : 1.0);
  s.grad_scale = static_cast<C>(grad_scale);
  return s;
}

// The update direction from the new moments (stage 2 recomputes it).
template <typename C>
KILN_HOST_DEVICE inline C lamb_direction(C p, C m, C v, const LambScalars<C>& s) {
  return (m * s.inv_bias_correction1) / (::sqrt(v * s.inv_bias_correction2) + s.eps) + s.weight_decay * p;
}

// Stage 1: the moments, and the update direction u (returned).
template <typename C>
KILN_HOST_DEVICE inline C lamb_moments(C p, C g, C& m, C& v, const LambScalars<C>& s) {
  g *= s.grad_scale;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  return lamb_direction(p, m, v, s);
}

// The trust ratio from the squared norms of p and u.
KILN_HOST_DEVICE inline double lamb_trust_ratio(double param_sq, double update_sq) {
  return param_sq > 0.0 && update_sq > 0.0 ? ::sqrt(param_sq) / ::sqrt(update_sq) : 1.0;
}

// ---------------------------------------------------------------- LARS
// The factor applied to (g + wd*p), or 0 when a norm is zero (then g is used as is).
KILN_HOST_DEVICE inline double lars_trust_ratio(const LarsConfig& config, double param_sq, double grad_sq) {
  if (!(param_sq > 0.0 && grad_sq > 0.0)) return 0.0;
  const double param_norm = ::sqrt(param_sq), grad_norm = ::sqrt(grad_sq);
  return config.trust_coefficient * param_norm / (grad_norm + config.weight_decay * param_norm + config.eps);
}

template <typename C>
struct LarsScalars {
  C lr, momentum, weight_decay, ratio, grad_scale;
  bool adapt, first;
};

template <typename C>
KILN_HOST_DEVICE inline void lars_element(C& p, C g, C* buf, const LarsScalars<C>& s) {
  g *= s.grad_scale;
  if (s.adapt) g = (g + s.weight_decay * p) * s.ratio;
  if (buf != nullptr) {
    const C b = s.first ? g : s.momentum * *buf + g;
    *buf = b;
    g = b;
  }
  p -= s.lr * g;
}

// ---------------------------------------------------------------- averaging
template <typename A>
KILN_HOST_DEVICE inline A average_element(A avg, A value, A weight, A divisor, bool divide) {
  if (divide) return divisor == A(1) ? value : avg + (value - avg) / divisor;
  // torch.lerp: the two forms keep the result exact at weight 0 and 1.
  return weight < A(0.5) ? avg + weight * (value - avg) : value - (value - avg) * (A(1) - weight);
}

// ---------------------------------------------------------------- norms
// Combines two partials of a norm reduction: max for p = inf (NaN sticks), else a sum.
KILN_HOST_DEVICE inline double norm_combine(double a, double b, bool is_max) {
  if (!is_max) return a + b;
  if (::isnan(a) || ::isnan(b)) return a + b;
  return a > b ? a : b;
}

KILN_HOST_DEVICE inline double norm_element(double x, double norm_type, int mode) {
  // mode 0: p = 1, 1: p = 2, 2: p = inf, 3: other p
  const double a = ::fabs(x);
  switch (mode) {
    case 0: return a;
    case 1: return x * x;
    case 2: return a;
    default: return ::pow(a, norm_type);
  }
}

inline int norm_mode(double norm_type) {
  if (norm_type == 1.0) return 0;
  if (norm_type == 2.0) return 1;
  if (::isinf(norm_type)) return 2;
  return 3;
}

KILN_HOST_DEVICE inline double norm_finish(double combined, double norm_type, int mode) {
  switch (mode) {
    case 0:
    case 2: return combined;
    case 1: return ::sqrt(combined);
    default: return ::pow(combined, 1.0 / norm_type);
  }
}

// torch.nn.utils.clip_grad_norm_: clamp(max_norm / (total + 1e-6), max=1), NaN propagating.
KILN_HOST_DEVICE inline float clip_coefficient(double max_norm, float total_norm) {
  const float coef = static_cast<float>(max_norm) / (total_norm + 1e-6f);
  return ::isnan(coef) ? coef : (coef > 1.0f ? 1.0f : coef);
}

}  // namespace kiln::kernels::optim_math
