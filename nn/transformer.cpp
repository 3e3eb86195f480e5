#include "nn/transformer.h"

#include <cmath>
#include <limits>

#include "core/nn_ops.h"
#include "core/ops.h"
#include "nn/init.h"

namespace kiln::nn {

namespace {

// torch.nn's masks (bool true = may not attend; float = added) as one mask for
// scaled_dot_product_attention over (N, H, L, S): bool true = may attend, or
// additive floats of `dtype` when both masks are given or either is float.
Tensor attention_mask(const Tensor& attn_mask, const Tensor& key_padding_mask, int64_t N, int64_t H, int64_t L,
                      int64_t S, DType dtype) {
  if (!attn_mask.defined() && !key_padding_mask.defined()) return Tensor();
  const TensorOptions like{.dtype = dtype, .device = attn_mask.defined() ? attn_mask.device() : key_padding_mask.device()};
  const auto additive = [&](const Tensor& mask) {
    if (mask.dtype() != DType::b8) return cast(mask, dtype);
    return where(mask, scalar_tensor(-std::numeric_limits<double>::infinity(), like), scalar_tensor(0.0, like));
  };
  Tensor attn, padding;
  if (attn_mask.defined()) {
    KILN_CHECK((attn_mask.dim() == 2 && attn_mask.shape() == Shape({L, S})) ||
                   (attn_mask.dim() == 3 && attn_mask.shape() == Shape({N * H, L, S})),
               "MultiheadAttention: attn_mask of shape ", shape_str(attn_mask.shape()), ", expected (", L, ", ", S,
               ") or (", N * H, ", ", L, ", ", S, ")");
    attn = attn_mask.dim() == 3 ? attn_mask.reshape({N, H, L, S}) : attn_mask;
  }
  if (key_padding_mask.defined()) {
    KILN_CHECK(key_padding_mask.shape() == Shape({N, S}), "MultiheadAttention: key_padding_mask of shape ",
               shape_str(key_padding_mask.shape()), ", expected (", N, ", ", S, ")");
    padding = key_padding_mask.reshape({N, 1, 1, S});
  }
  if (attn.defined() && padding.defined()) return add(additive(attn), additive(padding));
  const Tensor& only = attn.defined() ? attn : padding;
  return only.dtype() == DType::b8 ? eq(only, 0.0) : cast(only, dtype);  // torch.nn's true = masked out
}

Tensor activate(const Tensor& x, const std::string& activation) {
  return activation == "gelu" ? gelu(x) : relu(x);
}

}  // namespace

// ---------------------------------------------------------------- MultiheadAttention
MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads, double dropout, bool bias,
                                       bool batch_first)
    : embed_dim(embed_dim), num_heads(num_heads), dropout(dropout), batch_first(batch_first) {
  KILN_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0, "MultiheadAttention: embed_dim ",
             embed_dim, " must be a positive multiple of num_heads ", num_heads);
  KILN_CHECK(dropout >= 0 && dropout < 1, "MultiheadAttention: dropout must be in [0, 1), got ", dropout);
  head_dim = embed_dim / num_heads;
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * embed_dim, embed_dim}));
  if (bias) in_proj_bias = register_parameter("in_proj_bias", empty({3 * embed_dim}));
  out_proj = register_module("out_proj", std::make_shared<Linear>(embed_dim, embed_dim, bias));
  reset_parameters();
}

void MultiheadAttention::reset_parameters() {
  // torch's _reset_parameters: xavier_uniform_ for the stacked projection,
  // zero biases; out_proj keeps Linear's weight initialization.
  init::xavier_uniform_(in_proj_weight);
  if (in_proj_bias.defined()) init::zeros_(in_proj_bias);
  if (out_proj->bias.defined()) init::zeros_(out_proj->bias);
}

std::string MultiheadAttention::extra_repr() const {
  return "embed_dim=" + std::to_string(embed_dim) + ", num_heads=" + std::to_string(num_heads) +
         ", dropout=" + std::to_string(dropout) + ", batch_first=" + (batch_first ? "true" : "false");
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask, bool is_causal) {
  KILN_CHECK(query.defined() && key.defined() && value.defined(), "MultiheadAttention: undefined query, key or value");
  KILN_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3, "MultiheadAttention: expected 3-D query, key and value (",
             batch_first ? "N, L, E" : "L, N, E", "), got ", shape_str(query.shape()), ", ", shape_str(key.shape()),
             " and ", shape_str(value.shape()));
  const Tensor q_in = batch_first ? query : query.transpose(0, 1);  // (N, L, E)
  const Tensor k_in = batch_first ? key : key.transpose(0, 1);      // (N, S, E)
  const Tensor v_in = batch_first ? value : value.transpose(0, 1);
  const int64_t N = q_in.size(0), L = q_in.size(1), S = k_in.size(1), E = embed_dim, H = num_heads;
  KILN_CHECK(q_in.size(2) == E && k_in.size(2) == E && v_in.size(2) == E, "MultiheadAttention: embed_dim is ", E,
             ", got query ", shape_str(query.shape()), ", key ", shape_str(key.shape()), ", value ",
             shape_str(value.shape()));
  KILN_CHECK(k_in.size(0) == N && v_in.size(0) == N && v_in.size(1) == S, "MultiheadAttention: batch or length of ",
             "key ", shape_str(key.shape()), " and value ", shape_str(value.shape()), " do not match query ",
             shape_str(query.shape()));
  const auto bias_of = [&](int64_t part) {
    return in_proj_bias.defined() ? in_proj_bias.narrow(0, part * E, E) : Tensor();
  };
  Tensor q, k, v;
  if (query.same(key) && key.same(value)) {
    // Self-attention: one (N, L, 3E) product, split into q, k, v.
    const std::vector<Tensor> qkv = chunk(linear(q_in, in_proj_weight, in_proj_bias), 3, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    q = linear(q_in, in_proj_weight.narrow(0, 0, E), bias_of(0));
    k = linear(k_in, in_proj_weight.narrow(0, E, E), bias_of(1));
    v = linear(v_in, in_proj_weight.narrow(0, 2 * E, E), bias_of(2));
  }
  const auto heads = [&](const Tensor& x, int64_t length) { return x.reshape({N, length, H, head_dim}).transpose(1, 2); };
  Tensor mask = attention_mask(attn_mask, key_padding_mask, N, H, L, S, query.dtype());
  bool causal = is_causal && !attn_mask.defined();
  if (causal && mask.defined()) {
    // A causal hint with a padding mask: the causal part joins the mask.
    const TensorOptions like{.dtype = query.dtype(), .device = query.device()};
    const Tensor future = gt(triu(ones({L, S}, like), 1), 0.0);
    const Tensor causal_additive = where(future, scalar_tensor(-std::numeric_limits<double>::infinity(), like),
                                         scalar_tensor(0.0, like));
    mask = add(mask.dtype() == DType::b8 ? where(mask, scalar_tensor(0.0, like),
                                                 scalar_tensor(-std::numeric_limits<double>::infinity(), like))
                                         : mask,
               causal_additive);
    causal = false;
  }
  const Tensor out = scaled_dot_product_attention(heads(q, L), heads(k, S), heads(v, S), mask,
                                                  is_training() ? dropout : 0.0, causal);  // (N, H, L, D)
  const Tensor merged = out.transpose(1, 2).reshape({N, L, E});
  const Tensor projected = out_proj->forward(merged);
  return batch_first ? projected : projected.transpose(0, 1);
}

// ---------------------------------------------------------------- TransformerEncoderLayer
TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, const TransformerLayerOptions& o)
    : options(o) {
  KILN_CHECK(o.activation == "relu" || o.activation == "gelu", "TransformerEncoderLayer: activation must be \"relu\" ",
             "or \"gelu\", got \"", o.activation, "\"");
  // torch's registration order (and names).
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, o.dropout, o.bias,
                                                                                o.batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, d_model, o.bias));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, o.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, o.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerEncoderLayer::self_attention_block(const Tensor& x, const Tensor& mask, const Tensor& padding,
                                                     bool is_causal) {
  return dropout1->forward(self_attn->forward(x, x, x, padding, mask, is_causal));
}

Tensor TransformerEncoderLayer::feed_forward_block(const Tensor& x) {
  return dropout2->forward(linear2->forward(dropout->forward(activate(linear1->forward(x), options.activation))));
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const Tensor& src_mask, const Tensor& src_key_padding_mask,
                                        bool is_causal) {
  if (options.norm_first) {
    Tensor x = add(src, self_attention_block(norm1->forward(src), src_mask, src_key_padding_mask, is_causal));
    return add(x, feed_forward_block(norm2->forward(x)));
  }
  Tensor x = norm1->forward(add(src, self_attention_block(src, src_mask, src_key_padding_mask, is_causal)));
  return norm2->forward(add(x, feed_forward_block(x)));
}

// ---------------------------------------------------------------- TransformerDecoderLayer
TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, const TransformerLayerOptions& o)
    : options(o) {
  KILN_CHECK(o.activation == "relu" || o.activation == "gelu", "TransformerDecoderLayer: activation must be \"relu\" ",
             "or \"gelu\", got \"", o.activation, "\"");
  self_attn = register_module("self_attn", std::make_shared<MultiheadAttention>(d_model, nhead, o.dropout, o.bias,
                                                                                o.batch_first));
  multihead_attn = register_module("multihead_attn", std::make_shared<MultiheadAttention>(d_model, nhead, o.dropout,
                                                                                          o.bias, o.batch_first));
  linear1 = register_module("linear1", std::make_shared<Linear>(d_model, o.dim_feedforward, o.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(o.dropout));
  linear2 = register_module("linear2", std::make_shared<Linear>(o.dim_feedforward, d_model, o.bias));
  norm1 = register_module("norm1", std::make_shared<LayerNorm>(Shape{d_model}, o.layer_norm_eps));
  norm2 = register_module("norm2", std::make_shared<LayerNorm>(Shape{d_model}, o.layer_norm_eps));
  norm3 = register_module("norm3", std::make_shared<LayerNorm>(Shape{d_model}, o.layer_norm_eps));
  dropout1 = register_module("dropout1", std::make_shared<Dropout>(o.dropout));
  dropout2 = register_module("dropout2", std::make_shared<Dropout>(o.dropout));
  dropout3 = register_module("dropout3", std::make_shared<Dropout>(o.dropout));
}

Tensor TransformerDecoderLayer::feed_forward_block(const Tensor& x) {
  return dropout3->forward(linear2->forward(dropout->forward(activate(linear1->forward(x), options.activation))));
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory, const Tensor& tgt_mask,
                                        const Tensor& memory_mask, const Tensor& tgt_key_padding_mask,
                                        const Tensor& memory_key_padding_mask, bool tgt_is_causal,
                                        bool memory_is_causal) {
  const auto self_block = [&](const Tensor& x) {
    return dropout1->forward(self_attn->forward(x, x, x, tgt_key_padding_mask, tgt_mask, tgt_is_causal));
  };
  const auto cross_block = [&](const Tensor& x) {
    return dropout2->forward(
        multihead_attn->forward(x, memory, memory, memory_key_padding_mask, memory_mask, memory_is_causal));
  };
  if (options.norm_first) {
    Tensor x = add(tgt, self_block(norm1->forward(tgt)));
    x = add(x, cross_block(norm2->forward(x)));
    return add(x, feed_forward_block(norm3->forward(x)));
  }
  Tensor x = norm1->forward(add(tgt, self_block(tgt)));
  x = norm2->forward(add(x, cross_block(x)));
  return norm3->forward(add(x, feed_forward_block(x)));
}

// ---------------------------------------------------------------- RMSNorm
RMSNorm::RMSNorm(Shape normalized_shape, std::optional<double> eps, bool elementwise_affine)
    : normalized_shape(std::move(normalized_shape)), eps(eps) {
  if (elementwise_affine) weight = register_parameter("weight", ones(this->normalized_shape));
}

Tensor RMSNorm::forward(const Tensor& input) { return rms_norm(input, normalized_shape, weight, eps); }

}  // namespace kiln::nn
