// Op-table rows of the softmax family (core/ops/softmax.cpp). Loss rows make
// their own inputs: logits (dtype), int64 targets (input 1, not
// differentiable: grad_inputs = {0}) and, where listed, positive class weights
// (input 2). Every 4th target is ignore_index (-100) in the ignore rows.
#include <random>

#include "core/ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Inputs = std::vector<Tensor>;

const OpSample k2d{{{4, 5}}, "2-d"};
const OpSample k3d{{{2, 3, 4}}, "3-d"};
const OpSample kOdd{{{7, 1031}}, "odd size (7,1031)"};
const OpSample kEmpty{{{0, 3}}, "empty (0,3)"};

OpInfo softmax_row(std::string name, std::function<Tensor(const Tensor&)> f, std::vector<OpSample> samples) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = [f = std::move(f)](const Inputs& in) { return f(in[0]); };
  info.samples = std::move(samples);
  return info;
}

// (logits, targets[, weight]) for shapes {logits, target[, weight]}.
Inputs loss_inputs(const OpSample& sample, DType dtype, uint64_t seed, bool with_ignore) {
  Inputs inputs = default_inputs(OpSample{{sample.shapes[0]}, ""}, dtype, seed);
  const Shape& logits = sample.shapes[0];
  const int64_t classes = logits.size() == 1 ? logits[0] : logits[1];
  std::mt19937_64 engine(seed + 1);
  std::vector<int64_t> target(static_cast<size_t>(shape_numel(sample.shapes[1])));
  for (size_t i = 0; i < target.size(); ++i) {
    target[i] = static_cast<int64_t>(engine() % static_cast<uint64_t>(classes));
    if (with_ignore && i % 4 == 1) target[i] = -100;
  }
  inputs.push_back(tensor<int64_t>(target, sample.shapes[1]));
  if (sample.shapes.size() > 2) {
    std::vector<double> weight(static_cast<size_t>(classes));
    for (size_t c = 0; c < weight.size(); ++c) weight[c] = 0.25 + 0.5 * static_cast<double>((c * 7) % 5);
    inputs.push_back(tensor<double>(weight, sample.shapes[2]).to(dtype));
  }
  return inputs;
}

OpInfo loss_row(std::string name, std::function<Tensor(const Inputs&)> fn, bool weighted, bool with_ignore) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = std::move(fn);
  if (weighted) {
    info.samples = {{{{6, 5}, {6}, {5}}, "(N,C)"},
                    {{{2, 4, 3, 3}, {2, 3, 3}, {4}}, "(N,C,H,W)"},
                    {{{3, 1031}, {3}, {1031}}, "odd classes (3,1031)"}};
  } else {
    info.samples = {{{{6, 5}, {6}}, "(N,C)"},
                    {{{2, 4, 3, 3}, {2, 3, 3}}, "(N,C,H,W)"},
                    {{{3, 1031}, {3}}, "odd classes (3,1031)"},
                    {{{5}, {}}, "(C) with a 0-d target"}};
  }
  info.make_inputs = [with_ignore](const OpSample& sample, DType dtype, uint64_t seed) {
    return loss_inputs(sample, dtype, seed, with_ignore);
  };
  info.grad_inputs = {0};
  return info;
}

Tensor weight_of(const Inputs& in) { return in.size() > 2 ? in[2] : Tensor(); }

}  // namespace

std::vector<OpInfo> softmax_op_infos() {
  std::vector<OpInfo> rows;
  rows.push_back(softmax_row("softmax", [](const Tensor& x) { return softmax(x, -1); }, {k2d, k3d, kOdd, kEmpty}));
  rows.push_back(softmax_row("softmax dim0", [](const Tensor& x) { return softmax(x, 0); }, {k2d, k3d}));
  rows.push_back(softmax_row("softmax middle_dim", [](const Tensor& x) { return softmax(x, 1); }, {k3d}));
  rows.push_back(softmax_row("log_softmax", [](const Tensor& x) { return log_softmax(x, -1); }, {k2d, k3d, kOdd, kEmpty}));
  rows.push_back(softmax_row("log_softmax middle_dim", [](const Tensor& x) { return log_softmax(x, 1); }, {k3d}));

  rows.push_back(loss_row("cross_entropy", [](const Inputs& in) { return cross_entropy(in[0], in[1]); }, false, false));
  rows.push_back(loss_row(
      "cross_entropy weights",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], weight_of(in)); }, true, false));
  rows.push_back(loss_row(
      "cross_entropy ignore_index",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], Tensor(), -100); }, false, true));
  rows.push_back(loss_row(
      "cross_entropy label_smoothing",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], Tensor(), -100, 0.1); }, false, false));
  rows.push_back(loss_row(
      "cross_entropy weights_smoothing_ignore",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], weight_of(in), -100, 0.1); }, true, true));
  rows.push_back(loss_row(
      "cross_entropy sum",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], weight_of(in), -100, 0.1, Reduction::sum); }, true,
      true));
  rows.push_back(loss_row(
      "cross_entropy none",
      [](const Inputs& in) { return cross_entropy(in[0], in[1], Tensor(), -100, 0.1, Reduction::none); }, false,
      true));

  rows.push_back(loss_row("nll_loss", [](const Inputs& in) { return nll_loss(in[0], in[1]); }, false, false));
  rows.push_back(loss_row(
      "nll_loss weights_ignore", [](const Inputs& in) { return nll_loss(in[0], in[1], weight_of(in), -100); }, true,
      true));
  rows.push_back(loss_row(
      "nll_loss none",
      [](const Inputs& in) { return nll_loss(in[0], in[1], Tensor(), -100, Reduction::none); }, false, true));
  return rows;
}

}  // namespace kiln::testing
