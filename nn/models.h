// Reference models. Their state_dict names match the torch.nn definitions in
// the README, so weights move between kiln and PyTorch.
#pragma once

#include <string>
#include <vector>

#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/transformer.h"

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

// ---------------------------------------------------------------- transformers

// A Vision Transformer for small images: a strided Conv2d cuts patch_size
// patches and embeds them (patch_embed), a class token (cls_token, (1, 1, dim))
// and learned position embeddings (pos_embed, (1, patches + 1, dim)) join
// them, pre-norm TransformerEncoderLayers (blocks.{i}, GELU, batch_first) run,
// and the class token's final LayerNorm (norm) feeds a Linear (head).
struct ViTConfig {
  int64_t image_size = 28, patch_size = 4, in_channels = 1, num_classes = 10;
  int64_t dim = 96, depth = 6, heads = 4, mlp_dim = 192;
  double dropout = 0.0;      // inside the blocks
  double emb_dropout = 0.0;  // after the position embeddings
};
class ViT : public Module {
 public:
  explicit ViT(const ViTConfig& config = {});
  Tensor forward(const Tensor& images) override;  // (N, C, H, W) -> logits (N, classes)
  std::string type_name() const override { return "ViT"; }
  ViTConfig config;
  std::shared_ptr<Conv2d> patch_embed;
  Tensor cls_token, pos_embed;
  std::shared_ptr<Dropout> emb_dropout;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> head;
};

// GPT in nanoGPT's shape and names (Karpathy's nanoGPT model.py): token and
// position embeddings (transformer.wte, transformer.wpe), pre-norm blocks
// (transformer.h.{i}: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj) with causal attention, transformer.ln_f, and an lm_head whose
// weight is tied to transformer.wte.weight. Initialization as nanoGPT's:
// N(0, 0.02), and N(0, 0.02 / sqrt(2 n_layer)) for the residual projections.
struct GPTConfig {
  int64_t block_size = 1024, vocab_size = 50304, n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;
  bool bias = true;
  // GPT-2's configurations by name: "gpt2-124m" (or "gpt2"), "gpt2-medium",
  // "gpt2-large", "gpt2-xl" (vocabulary 50257, context 1024). Throws naming
  // the known names for another.
  static GPTConfig named(const std::string& name);
};
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;  // (B, T, C)
  std::string type_name() const override { return "CausalSelfAttention"; }
  int64_t n_head, n_embd;
  double dropout;
  std::shared_ptr<Linear> c_attn, c_proj;
  std::shared_ptr<Dropout> resid_dropout;
};
// c_fc (n_embd -> 4 n_embd), GELU, c_proj (back), dropout: nanoGPT's MLP.
class GPTMLP : public Module {
 public:
  explicit GPTMLP(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<Linear> c_fc, c_proj;
  std::shared_ptr<Dropout> dropout;
};
class GPTBlock : public Module {
 public:
  explicit GPTBlock(const GPTConfig& config);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
};
class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& config = {});
  // idx (B, T) int64 token ids, T <= block_size -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& idx) override;
  // Mean cross-entropy of the next-token logits against targets (B, T);
  // targets of -1 are ignored (nanoGPT's ignore_index).
  Tensor loss(const Tensor& logits, const Tensor& targets) const;
  // nanoGPT's two parameter groups: weight decay on matrices and embeddings
  // (dim >= 2), none on biases and LayerNorm weights.
  std::vector<Tensor> decay_parameters() const;
  std::vector<Tensor> no_decay_parameters() const;
  // Appends max_new_tokens sampled tokens to idx (B, T): each from the
  // softmax of the last logits / temperature, keeping the top_k largest when
  // top_k > 0 (nanoGPT's generate). Runs in eval mode without gradients.
  Tensor generate(Tensor idx, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0);
  std::string type_name() const override { return "GPT"; }

  GPTConfig config;
  std::shared_ptr<Module> transformer;  // wte, wpe, drop, h, ln_f
  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> h;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;
};

}  // namespace kiln::nn
