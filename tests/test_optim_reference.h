// float64 reference loops of the textbook optimizer updates (PyTorch's
// documented algorithms, in the operation order of torch.optim's
// single-tensor implementations), and the setup shared by the optimizer tests.
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace kiln::testing::optim_ref {

enum class Kind { sgd, adam, adamw, lamb, lars };

struct Hyper {
  double lr = 1e-3;
  double momentum = 0;  // SGD/LARS momentum, Adam/LAMB beta1
  double beta2 = 0.999;
  double weight_decay = 0;
};

struct Config {
  const char* label;
  Kind kind;
  Hyper group[2];
  double eps = 1e-8;
  double dampening = 0;
  double trust = 0.001;
  bool nesterov = false;
  bool maximize = false;
  bool amsgrad = false;
  bool bias_correction = true;
};

struct RefState {
  std::vector<double> p, buf, m, v, vmax;
  int64_t step = 0;
};

inline double norm2(const std::vector<double>& x) {
  double sum = 0;
  for (double v : x) sum += v * v;
  return std::sqrt(sum);
}

// One update of one parameter with gradient g (already in the param's precision).
inline void ref_step(const Config& c, const Hyper& h, RefState& s, const std::vector<double>& grad) {
  ++s.step;
  const size_t n = s.p.size();
  if (s.buf.empty()) s.buf.assign(n, 0.0), s.m.assign(n, 0.0), s.v.assign(n, 0.0), s.vmax.assign(n, 0.0);
  const double t = static_cast<double>(s.step);
  switch (c.kind) {
    case Kind::sgd:
      for (size_t i = 0; i < n; ++i) {
        double g = c.maximize ? -grad[i] : grad[i];
        if (h.weight_decay != 0) g += h.weight_decay * s.p[i];
        if (h.momentum != 0) {
          s.buf[i] = s.step == 1 ? g : h.momentum * s.buf[i] + (1 - c.dampening) * g;
          g = c.nesterov ? g + h.momentum * s.buf[i] : s.buf[i];
        }
        s.p[i] -= h.lr * g;
      }
      break;
    case Kind::adam:
    case Kind::adamw: {
      const double bc1 = 1 - std::pow(h.momentum, t), bc2 = 1 - std::pow(h.beta2, t);
      for (size_t i = 0; i < n; ++i) {
        double g = c.maximize ? -grad[i] : grad[i];
        if (c.kind == Kind::adamw) {
          s.p[i] *= 1 - h.lr * h.weight_decay;
        } else if (h.weight_decay != 0) {
          g += h.weight_decay * s.p[i];
        }
        s.m[i] = h.momentum * s.m[i] + (1 - h.momentum) * g;
        s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * g * g;
        double second = s.v[i];
        if (c.amsgrad) second = s.vmax[i] = std::max(s.vmax[i], s.v[i]);
        const double denom = std::sqrt(second) / std::sqrt(bc2) + c.eps;
        s.p[i] -= h.lr / bc1 * s.m[i] / denom;
      }
      break;
    }
    case Kind::lamb: {
      const double bc1 = c.bias_correction ? 1 - std::pow(h.momentum, t) : 1.0;
      const double bc2 = c.bias_correction ? 1 - std::pow(h.beta2, t) : 1.0;
      std::vector<double> u(n);
      for (size_t i = 0; i < n; ++i) {
        s.m[i] = h.momentum * s.m[i] + (1 - h.momentum) * grad[i];
        s.v[i] = h.beta2 * s.v[i] + (1 - h.beta2) * grad[i] * grad[i];
        u[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + c.eps) + h.weight_decay * s.p[i];
      }
      const double pn = norm2(s.p), un = norm2(u);
      const double ratio = pn > 0 && un > 0 ? pn / un : 1.0;
      for (size_t i = 0; i < n; ++i) s.p[i] -= h.lr * ratio * u[i];
      break;
    }
    case Kind::lars: {
      const double pn = norm2(s.p), gn = norm2(grad);
      const bool adapt = pn > 0 && gn > 0;
      const double ratio = adapt ? c.trust * pn / (gn + h.weight_decay * pn + c.eps) : 1.0;
      for (size_t i = 0; i < n; ++i) {
        double d = adapt ? (grad[i] + h.weight_decay * s.p[i]) * ratio : grad[i];
        if (h.momentum != 0) {
          s.buf[i] = s.step == 1 ? d : h.momentum * s.buf[i] + d;
          d = s.buf[i];
        }
        s.p[i] -= h.lr * d;
      }
      break;
    }
  }
}

inline std::unique_ptr<optim::Optimizer> make_optimizer(const Config& c, std::vector<optim::ParamGroup> groups) {
  for (size_t g = 0; g < groups.size() && g < 2; ++g) {
    groups[g].lr = c.group[g].lr;
    groups[g].weight_decay = c.group[g].weight_decay;
    groups[g].momentum = c.group[g].momentum;
    if (c.kind != Kind::sgd && c.kind != Kind::lars) groups[g].beta2 = c.group[g].beta2;
  }
  const Hyper& h = c.group[0];
  switch (c.kind) {
    case Kind::sgd:
      return std::make_unique<optim::SGD>(std::move(groups),
                                          optim::SGDOptions{.lr = h.lr, .momentum = h.momentum,
                                                            .dampening = c.dampening, .weight_decay = h.weight_decay,
                                                            .nesterov = c.nesterov, .maximize = c.maximize});
    case Kind::adam: {
      optim::AdamOptions o;
      o.eps = c.eps, o.amsgrad = c.amsgrad, o.maximize = c.maximize;
      return std::make_unique<optim::Adam>(std::move(groups), o);
    }
    case Kind::adamw: {
      optim::AdamWOptions o;
      o.eps = c.eps, o.amsgrad = c.amsgrad, o.maximize = c.maximize;
      return std::make_unique<optim::AdamW>(std::move(groups), o);
    }
    case Kind::lamb: {
      optim::LAMBOptions o;
      o.eps = c.eps, o.bias_correction = c.bias_correction;
      return std::make_unique<optim::LAMB>(std::move(groups), o);
    }
    case Kind::lars: {
      optim::LARSOptions o;
      o.eps = c.eps, o.trust_coefficient = c.trust;
      return std::make_unique<optim::LARS>(std::move(groups), o);
    }
  }
  return nullptr;
}

inline std::vector<Config> configs() {
  using K = Kind;
  std::vector<Config> list;
  list.push_back({"SGD momentum+dampening+wd", K::sgd, {{0.05, 0.9, 0, 1e-2}, {0.02, 0.5, 0, 0}}, 1e-8, 0.1});
  list.push_back({"SGD nesterov", K::sgd, {{0.03, 0.9, 0, 1e-3}, {0.01, 0.8, 0, 1e-2}}});
  list.back().nesterov = true;
  list.push_back({"SGD maximize, no momentum in group 0", K::sgd, {{0.05, 0, 0, 0}, {0.02, 0.9, 0, 1e-2}}});
  list.back().maximize = true;
  list.push_back({"Adam L2", K::adam, {{1e-2, 0.9, 0.999, 1e-2}, {5e-3, 0.8, 0.99, 0}}});
  list.push_back({"Adam amsgrad+maximize", K::adam, {{1e-2, 0.9, 0.999, 0}, {2e-3, 0.85, 0.995, 1e-3}}});
  list.back().amsgrad = true, list.back().maximize = true;
  list.push_back({"AdamW", K::adamw, {{1e-2, 0.9, 0.999, 0.1}, {3e-3, 0.9, 0.98, 0.01}}});
  list.push_back({"AdamW amsgrad", K::adamw, {{1e-2, 0.9, 0.999, 0.05}, {3e-3, 0.9, 0.98, 0}}});
  list.back().amsgrad = true;
  list.push_back({"LAMB", K::lamb, {{1e-2, 0.9, 0.999, 0.01}, {5e-3, 0.8, 0.99, 0}}, 1e-6});
  list.push_back({"LAMB no bias correction", K::lamb, {{1e-2, 0.9, 0.999, 0.01}, {5e-3, 0.8, 0.99, 0.1}}, 1e-6});
  list.back().bias_correction = false;
  list.push_back({"LARS", K::lars, {{0.1, 0.9, 0, 1e-4}, {0.05, 0, 0, 1e-3}}});
  list.back().trust = 0.02;
  return list;
}

// Values of a tensor as doubles.
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// A tensor of `dtype` from doubles (rounded to the dtype).
inline Tensor from_doubles(const std::vector<double>& v, const Shape& shape, DType dtype, Device device = Device::cpu()) {
  return tensor<double>(v, shape).to(device, dtype);
}

inline std::vector<double> normals(std::mt19937_64& rng, size_t n, double scale) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// Largest |a - r| / (atol + rtol * |r|); <= 1 passes.
inline double worst_ratio(const std::vector<double>& a, const std::vector<double>& r, double rtol, double atol) {
  if (a.size() != r.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::abs(a[i] - r[i]) / (atol + rtol * std::abs(r[i]));
    if (!(e <= worst)) worst = e;  // NaN wins
  }
  return worst;
}

}  // namespace kiln::testing::optim_ref
