// Op-table rows of the nn family (core/nn_ops.h): conv2d, batch_norm (and the
// fused batch_norm_relu and batch_norm_relu_max_pool2d), layer_norm, max/avg/adaptive-avg pooling. Shapes are
// small so that each row's float64 gradcheck stays well under a second.
#include <random>

#include "core/nn_ops.h"
#include "tests/support/op_info.h"

namespace kiln::testing {

namespace {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

OpInfo row(std::string name, Fn fn, std::vector<OpSample> samples) {
  OpInfo info;
  info.name = std::move(name);
  info.fn = std::move(fn);
  info.samples = std::move(samples);
  return info;
}

// Conv rows: inputs {x, weight} or {x, weight, bias}.
OpInfo conv_row(std::string name, Shape x, Shape w, bool bias, Size2 stride, Size2 padding, Size2 dilation,
                int64_t groups) {
  std::vector<Shape> shapes{x, w};
  if (bias) shapes.push_back({w[0]});
  return row(std::move(name),
             [=](const std::vector<Tensor>& in) {
               return conv2d(in[0], in[1], bias ? in[2] : Tensor(), stride, padding, dilation, groups);
             },
             {{shapes, "x " + shape_str(x) + " w " + shape_str(w)}});
}

// Batch-norm inputs {x, weight, bias, running_mean, running_var}: running_var
// positive, running stats small, so eval mode is well conditioned.
std::vector<Tensor> batch_norm_inputs(const OpSample& sample, DType dtype, uint64_t seed) {
  std::vector<Tensor> inputs = default_inputs(sample, dtype, seed);
  const int64_t C = sample.shapes[0][1];
  std::mt19937_64 engine(seed + 1);
  std::uniform_real_distribution<double> uniform(0.5, 1.5);
  std::vector<double> var(static_cast<size_t>(C)), mean(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    var[c] = uniform(engine);
    mean[c] = uniform(engine) - 1.0;
  }
  const DType stats_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  inputs[3] = tensor<double>(mean, {C}).to(stats_dtype);
  inputs[4] = tensor<double>(var, {C}).to(stats_dtype);
  for (int k = 1; k <= 2; ++k) inputs[k] = inputs[k].to(stats_dtype);
  return inputs;
}

// pool: batch_norm_relu_max_pool2d (relu is then implied).
OpInfo batch_norm_row(std::string name, Shape x, bool training, bool relu, bool affine, bool pool = false) {
  const int64_t C = x[1];
  OpInfo info = row(
      std::move(name),
      [=](const std::vector<Tensor>& in) {
        const Tensor w = affine ? in[1] : Tensor(), b = affine ? in[2] : Tensor();
        if (pool) return batch_norm_relu_max_pool2d(in[0], in[3], in[4], w, b, training, 0.1, 1e-5);
        return relu ? batch_norm_relu(in[0], in[3], in[4], w, b, training, 0.1, 1e-5)
                    : batch_norm(in[0], in[3], in[4], w, b, training, 0.1, 1e-5);
      },
      {{{x, {C}, {C}, {C}, {C}}, "x " + shape_str(x)}});
  info.make_inputs = batch_norm_inputs;
  info.grad_inputs = affine ? std::vector<int>{0, 1, 2} : std::vector<int>{0};
  return info;
}

}  // namespace

std::vector<OpInfo> nn_op_infos() {
  std::vector<OpInfo> rows;
  // ---- conv2d
  rows.push_back(conv_row("conv2d stride 2 padding 1 bias", {2, 3, 7, 9}, {4, 3, 3, 3}, true, 2, 1, 1, 1));
  // On CUDA the bias is added after cuDNN rounded the product to 16 bits (two
  // roundings, kiln's own bias kernel); the CPU rounds once. Where the bias
  // cancels a product of magnitude ~4, the two differ by up to half an ulp at 4.
  rows.back().parity_by_dtype = {{DType::f16, {1e-3, 2e-3}}, {DType::bf16, {1.6e-2, 1.6e-2}}};
  rows.back().tolerance_note = "16-bit: CUDA adds the bias after rounding the product";
  rows.push_back(conv_row("conv2d dilation 2 no bias", {2, 2, 7, 9}, {3, 2, 3, 3}, false, 1, {2, 1}, 2, 1));
  rows.push_back(conv_row("conv2d groups 2 bias", {2, 4, 6, 5}, {6, 2, 3, 2}, true, {1, 2}, {1, 0}, 1, 2));
  rows.back().parity_by_dtype = rows[rows.size() - 3].parity_by_dtype;
  rows.back().tolerance_note = rows[rows.size() - 3].tolerance_note;
  rows.push_back(conv_row("conv2d 1x1 no bias", {2, 3, 5, 4}, {4, 3, 1, 1}, false, 1, 0, 1, 1));
  rows.push_back(conv_row("conv2d single channel 3x3 pad 1", {3, 1, 5, 6}, {4, 1, 3, 3}, false, 1, 1, 1, 1));
  // ---- batch_norm
  rows.push_back(batch_norm_row("batch_norm training 4d", {3, 4, 3, 5}, true, false, true));
  rows.push_back(batch_norm_row("batch_norm training 2d", {6, 5}, true, false, true));
  rows.push_back(batch_norm_row("batch_norm training no affine", {4, 3, 5}, true, false, false));
  rows.push_back(batch_norm_row("batch_norm eval 4d", {3, 4, 3, 5}, false, false, true));
  rows.push_back(batch_norm_row("batch_norm_relu training", {3, 4, 3, 5}, true, true, true));
  rows.push_back(batch_norm_row("batch_norm_relu eval", {3, 4, 3, 5}, false, true, true));
  rows.push_back(batch_norm_row("batch_norm_relu_max_pool2d training", {3, 4, 5, 6}, true, true, true, true));
  rows.push_back(batch_norm_row("batch_norm_relu_max_pool2d eval odd", {2, 3, 5, 7}, false, true, true, true));
  // ---- layer_norm
  rows.push_back(row("layer_norm last dim",
                     [](const std::vector<Tensor>& in) { return layer_norm(in[0], {6}, in[1], in[2]); },
                     {{{{3, 4, 6}, {6}, {6}}, "(3, 4, 6) over (6)"}}));
  rows.push_back(row("layer_norm two dims no affine",
                     [](const std::vector<Tensor>& in) { return layer_norm(in[0], {4, 5}); },
                     {{{{3, 4, 5}}, "(3, 4, 5) over (4, 5)"}}));
  // ---- rms_norm
  rows.push_back(row("rms_norm last dim",
                     [](const std::vector<Tensor>& in) { return rms_norm(in[0], {6}, in[1], 1e-6); },
                     {{{{3, 4, 6}, {6}}, "(3, 4, 6) over (6), weight"}}));
  rows.push_back(row("rms_norm two dims default eps",
                     [](const std::vector<Tensor>& in) { return rms_norm(in[0], {4, 5}); },
                     {{{{3, 4, 5}}, "(3, 4, 5) over (4, 5)"}}));
  // ---- pooling
  rows.push_back(row("max_pool2d 2x2", [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2); },
                     {{{{2, 3, 6, 8}}, "non-overlapping"}, {{{2, 2, 7, 9}}, "odd size (floor)"}}));
  rows.push_back(row("max_pool2d 3x3 stride 2 padding 1",
                     [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, Size2(2), 1); },
                     {{{{2, 2, 7, 9}}, "overlapping, padded"}}));
  rows.push_back(row("max_pool2d dilation 2",
                     [](const std::vector<Tensor>& in) { return max_pool2d(in[0], {2, 3}, Size2(1), {1, 0}, 2); },
                     {{{{2, 7, 8}}, "unbatched"}}));
  rows.push_back(row("avg_pool2d 2x2", [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 2); },
                     {{{{2, 3, 6, 8}}, "non-overlapping"}}));
  rows.push_back(row("avg_pool2d 3x3 stride 2 padding 1",
                     [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 3, Size2(2), 1, true); },
                     {{{{2, 2, 7, 9}}, "count_include_pad"}}));
  rows.push_back(row("avg_pool2d 3x2 padding exclude pad",
                     [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], {3, 2}, Size2(1), 1, false); },
                     {{{{2, 2, 5, 6}}, "count_include_pad=false"}}));
  rows.push_back(row("adaptive_avg_pool2d",
                     [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], {3, 4}); },
                     {{{{2, 3, 7, 9}}, "7x9 -> 3x4 (uneven windows)"}, {{{2, 3, 4, 8}}, "4x8 -> 3x4"}}));
  rows.push_back(row("adaptive_avg_pool2d global",
                     [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 1); },
                     {{{{2, 3, 5, 5}}, "global"}}));
  return rows;
}

}  // namespace kiln::testing
