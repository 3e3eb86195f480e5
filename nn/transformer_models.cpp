// The transformer reference models of nn/models.h: ViT and GPT.
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "nn/init.h"
#include "nn/models.h"

namespace kiln::nn {

// ---------------------------------------------------------------- ViT
ViT::ViT(const ViTConfig& c) : config(c) {
  KILN_CHECK(c.patch_size > 0 && c.image_size % c.patch_size == 0, "ViT: image_size ", c.image_size,
             " must be a multiple of patch_size ", c.patch_size);
  const int64_t side = c.image_size / c.patch_size, patches = side * side;
  patch_embed = register_module("patch_embed", std::make_shared<Conv2d>(c.in_channels, c.dim, c.patch_size, c.patch_size));
  cls_token = register_parameter("cls_token", zeros({1, 1, c.dim}));
  pos_embed = register_parameter("pos_embed", empty({1, patches + 1, c.dim}));
  init::normal_(pos_embed, 0.0, 0.02);
  emb_dropout = register_module("emb_dropout", std::make_shared<Dropout>(c.emb_dropout));
  TransformerLayerOptions block;
  block.dim_feedforward = c.mlp_dim;
  block.dropout = c.dropout;
  block.activation = "gelu";
  block.batch_first = true;
  block.norm_first = true;
  blocks = register_module("blocks", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(std::make_shared<TransformerEncoderLayer>(c.dim, c.heads, block));
  norm = register_module("norm", std::make_shared<LayerNorm>(Shape{c.dim}));
  head = register_module("head", std::make_shared<Linear>(c.dim, c.num_classes));
}

Tensor ViT::forward(const Tensor& images) {
  KILN_CHECK(images.dim() == 4 && images.size(2) == config.image_size && images.size(3) == config.image_size,
             "ViT: expected images (N, ", config.in_channels, ", ", config.image_size, ", ", config.image_size,
             "), got ", shape_str(images.shape()));
  const int64_t N = images.size(0);
  const Tensor patches = patch_embed->forward(images).flatten(2).transpose(1, 2);  // (N, patches, dim)
  Tensor x = cat({cls_token.expand({N, 1, config.dim}), patches}, 1);
  x = emb_dropout->forward(add(x, pos_embed));
  x = norm->forward(blocks->forward(x));
  return head->forward(x.select(1, 0));  // the class token
}

// ---------------------------------------------------------------- GPT
GPTConfig GPTConfig::named(const std::string& name) {
  GPTConfig c;
  c.block_size = 1024;
  c.vocab_size = 50257;
  if (name == "gpt2-124m" || name == "gpt2") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
  } else {
    KILN_THROW("GPTConfig::named: unknown configuration '", name,
               "' (known: gpt2-124m or gpt2, gpt2-medium, gpt2-large, gpt2-xl)");
  }
  return c;
}

namespace {
void check_config(const GPTConfig& c) {
  KILN_CHECK(c.block_size > 0 && c.vocab_size > 0 && c.n_layer > 0, "GPT: block_size, vocab_size and n_layer must ",
             "be positive");
  KILN_CHECK(c.n_head > 0 && c.n_embd % c.n_head == 0, "GPT: n_embd ", c.n_embd, " must be a multiple of n_head ",
             c.n_head);
}

std::shared_ptr<LayerNorm> gpt_layer_norm(const GPTConfig& c) {
  auto norm = std::make_shared<LayerNorm>(Shape{c.n_embd});
  if (!c.bias) {
    norm->remove_parameter("bias");
    norm->bias = Tensor();
  }
  return norm;
}

// The modules of GPT.transformer (nanoGPT's ModuleDict).
class ModuleDict : public Module {
 public:
  std::string type_name() const override { return "ModuleDict"; }
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> module) {
    return register_module(name, std::move(module));
  }
};
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& c) : n_head(c.n_head), n_embd(c.n_embd), dropout(c.dropout) {
  c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, c.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, c.bias));
  resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const std::vector<Tensor> qkv = split(c_attn->forward(x), n_embd, 2);
  const auto heads = [&](const Tensor& t) { return t.reshape({B, T, n_head, C / n_head}).transpose(1, 2); };
  const Tensor y = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), Tensor(),
                                                is_training() ? dropout : 0.0, /*is_causal=*/true);
  return resid_dropout->forward(c_proj->forward(y.transpose(1, 2).reshape({B, T, C})));
}

GPTMLP::GPTMLP(const GPTConfig& c) {
  c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, c.bias));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, c.bias));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor GPTMLP::forward(const Tensor& x) { return dropout->forward(c_proj->forward(gelu(c_fc->forward(x)))); }

GPTBlock::GPTBlock(const GPTConfig& c) {
  ln_1 = register_module("ln_1", gpt_layer_norm(c));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(c));
  ln_2 = register_module("ln_2", gpt_layer_norm(c));
  mlp = register_module("mlp", std::make_shared<GPTMLP>(c));
}

Tensor GPTBlock::forward(const Tensor& x) {
  const Tensor y = add(x, attn->forward(ln_1->forward(x)));
  return add(y, mlp->forward(ln_2->forward(y)));
}

GPT::GPT(const GPTConfig& c) : config(c) {
  check_config(c);
  auto body = std::make_shared<ModuleDict>();
  wte = body->add("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd));
  wpe = body->add("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd));
  drop = body->add("drop", std::make_shared<Dropout>(c.dropout));
  h = body->add("h", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(std::make_shared<GPTBlock>(c));
  ln_f = body->add("ln_f", gpt_layer_norm(c));
  transformer = register_module("transformer", std::shared_ptr<Module>(body));
  lm_head = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, /*bias=*/false));
  // Weight tying (nanoGPT: transformer.wte.weight = lm_head.weight): one
  // tensor under both names; parameters() lists it once.
  lm_head->remove_parameter("weight");
  lm_head->weight = lm_head->register_parameter("weight", wte->weight);
  // nanoGPT's _init_weights, then the scaled residual projections.
  for (auto& [name, parameter] : named_parameters()) {
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (is_norm) continue;  // LayerNorm keeps ones and zeros
    if (is_bias) {
      init::zeros_(parameter);
    } else if (name.find("c_proj.weight") != std::string::npos) {
      init::normal_(parameter, 0.0, 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)));
    } else {
      init::normal_(parameter, 0.0, 0.02);
    }
  }
}

Tensor GPT::forward(const Tensor& idx) {
  KILN_CHECK(idx.dim() == 2 && (idx.dtype() == DType::i64 || idx.dtype() == DType::i32), "GPT: expected int64 ",
             "token ids (B, T), got ", dtype_name(idx.dtype()), " of shape ", shape_str(idx.shape()));
  const int64_t T = idx.size(1);
  KILN_CHECK(T <= config.block_size, "GPT: a sequence of ", T, " tokens is longer than block_size ",
             config.block_size);
  const Tensor positions = arange(0, static_cast<double>(T), 1, {.dtype = DType::i64, .device = idx.device()});
  Tensor x = drop->forward(add(wte->forward(idx), wpe->forward(positions)));
  x = ln_f->forward(h->forward(x));
  return lm_head->forward(x);
}

Tensor GPT::loss(const Tensor& logits, const Tensor& targets) const {
  const int64_t V = logits.size(-1);
  return cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}), Tensor(), /*ignore_index=*/-1);
}

std::vector<Tensor> GPT::decay_parameters() const {
  std::vector<Tensor> out;
  for (const Tensor& p : parameters()) {
    if (p.dim() >= 2) out.push_back(p);
  }
  return out;
}

std::vector<Tensor> GPT::no_decay_parameters() const {
  std::vector<Tensor> out;
  for (const Tensor& p : parameters()) {
    if (p.dim() < 2) out.push_back(p);
  }
  return out;
}

Tensor GPT::generate(Tensor idx, int64_t max_new_tokens, double temperature, int64_t top_k) {
  KILN_CHECK(temperature > 0, "GPT::generate: temperature must be positive, got ", temperature);
  NoGradGuard no_grad;
  const bool was_training = is_training();
  eval();
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t T = idx.size(1);
    const Tensor context = T <= config.block_size ? idx : idx.narrow(1, T - config.block_size, config.block_size);
    Tensor logits = div(forward(context).select(1, context.size(1) - 1), temperature);  // (B, V)
    if (top_k > 0) {
      const Tensor kth = topk(logits, std::min(top_k, logits.size(-1)), -1).values.narrow(1, std::min(top_k, logits.size(-1)) - 1, 1);
      logits = masked_fill(logits, lt(logits, kth), -std::numeric_limits<double>::infinity());
    }
    const Tensor next = multinomial(softmax(cast(logits, DType::f32), -1), 1);  // (B, 1)
    idx = cat({idx, next}, 1);
  }
  train(was_training);
  return idx;
}

}  // namespace kiln::nn
