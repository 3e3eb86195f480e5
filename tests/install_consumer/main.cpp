// Fits y = 3x - 1 with kiln's Linear and SGD from an installed kiln; exits 0
// only if the fit converged, so a package that links but computes nothing fails.
#include <cmath>
#include <cstdio>

#include "core/ops.h"
#include "core/generator.h"
#include "nn/layers.h"
#include "nn/loss.h"
#include "optim/optimizer.h"

int main() {
  using namespace kiln;
  manual_seed(0);
  Tensor x = rand({64, 1});
  Tensor y = add(mul(x, 3.0), -1.0);
  nn::Linear layer(1, 1);
  optim::SGDOptions options;
  options.lr = 0.5;
  optim::SGD optimizer(layer.parameters(), options);
  double loss_value = 0;
  for (int step = 0; step < 300; ++step) {
    Tensor loss = nn::MSELoss{}(layer.forward(x), y);
    optimizer.zero_grad(true);
    loss.backward();
    optimizer.step();
    loss_value = loss.item<double>();
  }
  std::printf("kiln_consumer: final loss %.3g\n", loss_value);
  return loss_value < 1e-4 ? 0 : 1;
}
