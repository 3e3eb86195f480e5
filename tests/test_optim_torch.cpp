// Optimizers against numbers produced by PyTorch itself (not by a reference
// loop written here), so that a formula misread the same way in kiln and in
// tests/test_optim_reference.h still shows. float64 params, two groups, the
// second group's param without a gradient on steps 1, 4, 7, ... (torch skips
// it: no state change), 20 steps; the values are the params after step 20.
//
// Regenerate with torch 2.15 (PyPI), single-tensor path:
//   import math, torch
//   p0 = torch.tensor([math.cos(1.1 * i) for i in range(5)], dtype=torch.float64, requires_grad=True)
//   p1 = torch.tensor([math.cos(1.1 * i + 0.3) for i in range(3)], dtype=torch.float64, requires_grad=True)
//   opt = torch.optim.<Kind>([{"params": [p0]}, dict(params=[p1], **group1)], foreach=False, **options)
//   grad(p, k, t) = [math.sin(0.7 * t + 1.3 * i + 0.4 * k) + 0.5 * p[i] for i in range(len(p))]
//   for t in range(1, 21):
//       p0.grad = grad(p0, 0, t); p1.grad = None if t % 3 == 1 else grad(p1, 1, t); opt.step()
//   print(p0.tolist() + p1.tolist())
// with <Kind>, options and group1 as in each case's comment below.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "optim/optimizer.h"
#include "tests/support/test_util.h"

using namespace kiln;
using namespace kiln::optim;

namespace {

struct TorchCase {
  const char* torch_call;  // <Kind>(..., **options) and group1
  std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>)> make;
  ParamGroup group1;
  std::vector<double> expected;  // p0 (5 values) then p1 (3 values) after step 20
};

ParamGroup group(double lr, std::optional<double> momentum = {}, std::optional<double> weight_decay = {},
                 std::optional<double> beta2 = {}) {
  ParamGroup g;
  g.lr = lr, g.momentum = momentum, g.weight_decay = weight_decay, g.beta2 = beta2;
  return g;
}

AdamOptions adam(double lr, double weight_decay, bool amsgrad, bool maximize) {
  AdamOptions o;
  o.lr = lr, o.weight_decay = weight_decay, o.amsgrad = amsgrad, o.maximize = maximize;
  return o;
}

std::vector<TorchCase> cases() {
  return {
      {"SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01); group1 lr=0.05, momentum=0.5",
       [](auto g) {
         return std::make_unique<SGD>(g, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1,
                                                    .weight_decay = 0.01});
       },
       group(0.05, 0.5),
       {0.21498951593686155, -0.18038757650434331, -0.34202237660775231, 0.03701111843613978,
        0.42827825574462219, 0.49534403789256376, 0.089603266007416235, -0.41241416516099522}},
      {"SGD(lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True); group1 lr=0.02, momentum=0.8",
       [](auto g) {
         return std::make_unique<SGD>(g, SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3,
                                                    .nesterov = true});
       },
       group(0.02, 0.8),
       {-0.17794206018764552, -0.22010675306794525, 0.016162731374294154, 0.28586940313050924,
        0.23261431459274731, 0.51436595088185944, 0.1207108441024955, -0.41333333455645627}},
      {"SGD(lr=0.05, maximize=True); group1 lr=0.02, momentum=0.9, weight_decay=0.01",
       [](auto g) { return std::make_unique<SGD>(g, SGDOptions{.lr = 0.05, .maximize = true}); },
       group(0.02, 0.9, 0.01),
       {1.7635114989460037, 0.80958253462962448, -1.0537456469198858, -1.7322515007173354,
        -0.47525312458552077, 1.7323609350015203, 0.15310119880341952, -1.5424705862353134}},
      {"Adam(lr=0.01, weight_decay=0.01); group1 lr=0.005, betas=(0.8, 0.99), weight_decay=0",
       [](auto g) { return std::make_unique<Adam>(g, adam(0.01, 0.01, false, false)); },
       group(0.005, 0.8, 0.0, 0.99),
       {0.87185837762655682, 0.3878863876919505, -0.48316126037998763, -0.86723422889874258,
        -0.28568799297104402, 0.91797801641723731, 0.17006857930746225, -0.76565503472858154}},
      {"Adam(lr=0.01, amsgrad=True, maximize=True); group1 lr=0.002, betas=(0.85, 0.995), weight_decay=1e-3",
       [](auto g) { return std::make_unique<Adam>(g, adam(0.01, 0.0, true, true)); },
       group(0.002, 0.85, 1e-3, 0.995),
       {1.1348068094882071, 0.52514542174746759, -0.70238632131333489, -1.1138998996255205,
        -0.32948665417891798, 0.97082284897318305, 0.16946312906574532, -0.81610958223501973}},
      {"Adam(lr=0.02, betas=(0.3, 0.9), eps=1e-3); group1 lr=0.01, betas=(0.45, 0.6)",
       [](auto g) {
         AdamOptions o = adam(0.02, 0.0, false, false);
         o.beta1 = 0.3, o.beta2 = 0.9, o.eps = 1e-3;
         return std::make_unique<Adam>(g, o);
       },
       group(0.01, 0.45, {}, 0.6),
       {0.7974313172758255, 0.32834181771320031, -0.45022665793635996, -0.77735538990240749,
        -0.23098652290078717, 0.88817080126338632, 0.1631899347161436, -0.74450090294086857}},
      {"AdamW(lr=0.01, weight_decay=0.1); group1 lr=0.003, betas=(0.9, 0.98), weight_decay=0.01",
       [](auto g) {
         AdamWOptions o;
         o.lr = 0.01, o.weight_decay = 0.1;
         return std::make_unique<AdamW>(g, o);
       },
       group(0.003, 0.9, 0.01, 0.98),
       {0.85492108218720342, 0.38082523714746574, -0.47391429819449038, -0.85058437569853007,
        -0.28071836448174969, 0.93124143383758351, 0.17125013663891822, -0.7775861228872647}},
      {"AdamW(lr=0.01, weight_decay=0.05, amsgrad=True, maximize=True); group1 lr=0.003, weight_decay=0",
       [](auto g) {
         AdamWOptions o;
         o.lr = 0.01, o.weight_decay = 0.05, o.amsgrad = true, o.maximize = true;
         return std::make_unique<AdamW>(g, o);
       },
       group(0.003, {}, 0.0),
       {1.1238989653555509, 0.52007909351643666, -0.69568133288523837, -1.1031760778341124,
        -0.3262468823131634, 0.97921546340585008, 0.16856115044580025, -0.82455750487953261}},
  };
}

Tensor initial(int k, int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(std::cos(1.1 * static_cast<double>(i) + 0.3 * k));
  return tensor<double>(v, {n}).requires_grad_();
}

Tensor gradient(const Tensor& p, int k, int t) {
  std::vector<double> v = p.detach().to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7 * t + 1.3 * static_cast<double>(i) + 0.4 * k) + 0.5 * v[i];
  return tensor<double>(v, {static_cast<int64_t>(v.size())});
}
}  // namespace

TEST_CASE("SGD, Adam and AdamW match torch 2.15's own numbers after 20 steps") {
  for (const TorchCase& c : cases()) {
    Tensor p0 = initial(0, 5), p1 = initial(1, 3);
    std::vector<ParamGroup> groups(2);
    groups[0].params = {p0};
    groups[1] = c.group1;
    groups[1].params = {p1};
    std::unique_ptr<Optimizer> optimizer = c.make(groups);
    for (int t = 1; t <= 20; ++t) {
      p0.set_grad(gradient(p0, 0, t));
      p1.set_grad(t % 3 == 1 ? Tensor() : gradient(p1, 1, t));
      optimizer->step();
    }
    std::vector<double> got = p0.detach().to_vector<double>();
    for (double v : p1.detach().to_vector<double>()) got.push_back(v);
    REQUIRE(got.size() == c.expected.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK_MESSAGE(std::abs(got[i] - c.expected[i]) <= 1e-12 * std::abs(c.expected[i]) + 1e-14, c.torch_call,
                    ": value ", i, " is ", got[i], ", torch ", c.expected[i]);
    }
  }
}
