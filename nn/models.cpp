#include "nn/models.h"

#include "core/ops.h"

namespace kiln::nn {

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride) {
  conv1 = register_module("conv1", std::make_shared<Conv2d>(in_channels, out_channels, 3, stride, 1, 1, 1, false));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(out_channels));
  conv2 = register_module("conv2", std::make_shared<Conv2d>(out_channels, out_channels, 3, 1, 1, 1, 1, false));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample = register_module(
        "downsample", std::make_shared<Sequential>(std::vector<ModulePtr>{
                          std::make_shared<Conv2d>(in_channels, out_channels, 1, stride, 0, 1, 1, false),
                          std::make_shared<BatchNorm2d>(out_channels)}));
  }
}

Tensor BasicBlock::forward(const Tensor& input) {
  Tensor out = bn1->forward_relu(conv1->forward(input));
  out = bn2->forward(conv2->forward(out));
  Tensor shortcut = downsample ? downsample->forward(input) : input;
  return relu(add(out, shortcut));
}

FashionCNN::FashionCNN(int64_t num_classes) {
  features = register_module(
      "features", std::make_shared<Sequential>(std::vector<ModulePtr>{
                      std::make_shared<Conv2d>(1, 32, 3, 1, 1, 1, 1, false), std::make_shared<BatchNorm2d>(32),
                      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
                      std::make_shared<Conv2d>(32, 64, 3, 1, 1, 1, 1, false), std::make_shared<BatchNorm2d>(64),
                      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2)}));
  classifier = register_module(
      "classifier", std::make_shared<Sequential>(std::vector<ModulePtr>{
                        std::make_shared<Flatten>(), std::make_shared<Linear>(64 * 7 * 7, 128),
                        std::make_shared<ReLU>(), std::make_shared<Linear>(128, num_classes)}));
}

Tensor FashionCNN::forward(const Tensor& input) { return classifier->forward(features->forward(input)); }

namespace {
std::shared_ptr<Sequential> conv_bn_relu(int64_t in_channels, int64_t out_channels, bool pool) {
  std::vector<ModulePtr> modules = {std::make_shared<Conv2d>(in_channels, out_channels, 3, 1, 1, 1, 1, false),
                                    std::make_shared<BatchNorm2d>(out_channels), std::make_shared<ReLU>()};
  if (pool) modules.push_back(std::make_shared<MaxPool2d>(2));
  return std::make_shared<Sequential>(modules);
}
}  // namespace

ResNet9::ResNet9(int64_t in_channels, int64_t num_classes) {
  prep = register_module("prep", conv_bn_relu(in_channels, 64, false));      // 28x28
  layer1 = register_module("layer1", conv_bn_relu(64, 128, true));           // 14x14
  residual1 = register_module("residual1", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                               std::make_shared<BasicBlock>(128, 128)}));
  layer2 = register_module("layer2", conv_bn_relu(128, 256, true));          // 7x7
  layer3 = register_module("layer3", conv_bn_relu(256, 512, true));          // 3x3
  residual3 = register_module("residual3", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                               std::make_shared<BasicBlock>(512, 512)}));
  head = register_module("head", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                     std::make_shared<AdaptiveAvgPool2d>(1), std::make_shared<Flatten>(),
                                     std::make_shared<Linear>(512, num_classes)}));
}

Tensor ResNet9::forward(const Tensor& input) {
  Tensor x = prep->forward(input);
  x = residual1->forward(layer1->forward(x));
  x = layer2->forward(x);
  x = residual3->forward(layer3->forward(x));
  return head->forward(x);
}

MLP::MLP(int64_t in_features, int64_t hidden, int64_t num_classes) {
  layers = register_module("layers", std::make_shared<Sequential>(std::vector<ModulePtr>{
                                         std::make_shared<Flatten>(), std::make_shared<Linear>(in_features, hidden),
                                         std::make_shared<ReLU>(), std::make_shared<Linear>(hidden, hidden / 2),
                                         std::make_shared<ReLU>(), std::make_shared<Linear>(hidden / 2, num_classes)}));
}

}  // namespace kiln::nn
