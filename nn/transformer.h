// Transformer layers with torch.nn's constructor arguments, defaults, mask
// conventions and state_dict names, so that weights load into torch.nn with
// the same outputs: MultiheadAttention, TransformerEncoderLayer,
// TransformerDecoderLayer, and RMSNorm. Attention runs through
// scaled_dot_product_attention (fused kernels; core/nn_ops.h).
//
// Mask conventions are torch.nn's, which differ from the functional form: in
// attn_mask and key_padding_mask a bool true means "may NOT attend" (a float
// mask is added to the scores). Shapes: (L, N, E) or, with batch_first,
// (N, L, E); attn_mask (L, S) or (N * num_heads, L, S); key_padding_mask (N, S).
#pragma once

#include <memory>
#include <string>

#include "nn/conv.h"
#include "nn/layers.h"

namespace kiln::nn {

class MultiheadAttention : public Module {
 public:
  // kdim = vdim = embed_dim (torch's default).
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout = 0.0, bool bias = true,
                     bool batch_first = false);
  // The attention output (torch's need_weights = false: the weights are never
  // formed). is_causal masks future keys when no attn_mask is given.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& key_padding_mask = Tensor(),
                 const Tensor& attn_mask = Tensor(), bool is_causal = false);
  // Self-attention: forward(x, x, x).
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }
  std::string type_name() const override { return "MultiheadAttention"; }
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t embed_dim, num_heads, head_dim;
  double dropout;
  bool batch_first;
  Tensor in_proj_weight, in_proj_bias;  // (3E, E), (3E): q, k, v stacked
  std::shared_ptr<Linear> out_proj;
};

struct TransformerLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;  // pre-norm (what ViT and GPT use)
  bool bias = true;
};

class TransformerEncoderLayer : public Module {
 public:
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, const TransformerLayerOptions& options = {});
  Tensor forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask = Tensor(),
                 bool is_causal = false);
  Tensor forward(const Tensor& src) override { return forward(src, Tensor()); }
  std::string type_name() const override { return "TransformerEncoderLayer"; }

  TransformerLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2;

 private:
  Tensor self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding, bool is_causal);
  Tensor feed_forward_block(const Tensor& x);
};

class TransformerDecoderLayer : public Module {
 public:
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, const TransformerLayerOptions& options = {});
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask = Tensor(),
                 const Tensor& memory_mask = Tensor(), const Tensor& tgt_key_padding_mask = Tensor(),
                 const Tensor& memory_key_padding_mask = Tensor(), bool tgt_is_causal = false,
                 bool memory_is_causal = false);
  std::string type_name() const override { return "TransformerDecoderLayer"; }

  TransformerLayerOptions options;
  std::shared_ptr<MultiheadAttention> self_attn, multihead_attn;
  std::shared_ptr<Linear> linear1, linear2;
  std::shared_ptr<LayerNorm> norm1, norm2, norm3;
  std::shared_ptr<Dropout> dropout, dropout1, dropout2, dropout3;

 private:
  Tensor feed_forward_block(const Tensor& x);
};

// torch.nn.RMSNorm: x / rms(x) over the trailing dims, times a weight of ones.
class RMSNorm : public Module {
 public:
  explicit RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string type_name() const override { return "RMSNorm"; }
  Shape normalized_shape;
  std::optional<double> eps;
  Tensor weight;
};

}  // namespace kiln::nn
