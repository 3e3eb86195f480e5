// Reference models. Their state_dict names match the torch.nn definitions in
// the README, so weights move between kiln and PyTorch.
#pragma once

#include "nn/conv.h"
#include "nn/layers.h"

namespace kiln::nn {

// torchvision-style residual block: conv3x3-BN-ReLU-conv3x3-BN, plus the input
// (through a 1x1 conv-BN "downsample" when the shape changes), then ReLU.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride = 1);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> downsample;  // null when the shortcut is the identity
};

// conv(1->32, 3x3, pad 1, no bias)-BN-ReLU-maxpool2, conv(32->64, same)-BN-ReLU-maxpool2,
// flatten, Linear(3136->128)-ReLU, Linear(128->10). Names: features.{0,1,4,5}.*, classifier.{1,3}.*.
class FashionCNN : public Module {
 public:
  explicit FashionCNN(int64_t num_classes = 10);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "FashionCNN"; }
  std::shared_ptr<Sequential> features, classifier;
};

// ResNet-9-style net for 28x28 inputs (widths 64/128/256/512): prep conv,
// [conv-pool + residual block], conv-pool, [conv-pool + residual block],
// global average pool, linear.
class ResNet9 : public Module {
 public:
  explicit ResNet9(int64_t in_channels = 1, int64_t num_classes = 10);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "ResNet9"; }
  std::shared_ptr<Sequential> prep, layer1, residual1, layer2, layer3, residual3, head;
};

// Flatten, Linear(784->hidden)-ReLU, Linear(hidden->hidden/2)-ReLU, Linear(->classes).
class MLP : public Module {
 public:
  explicit MLP(int64_t in_features = 784, int64_t hidden = 256, int64_t num_classes = 10);
  Tensor forward(const Tensor& input) override { return layers->forward(input); }
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<Sequential> layers;
};

}  // namespace kiln::nn
