// MultiheadAttention, the transformer layers, ViT and GPT: shapes, masks,
// causality, tied weights, parameter groups, sampling, and that they learn.
// (tests/test_torch_interop.cpp checks their outputs against torch.nn.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/nn_ops.h"
#include "core/ops.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "optim/optimizer.h"
#include "tests/support/test_util.h"

namespace kiln::testing {

namespace {
nn::GPTConfig tiny_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 17;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}
}  // namespace

TEST_CASE("MultiheadAttention: torch.nn's shapes, sequence-first or batch-first, and its mask conventions") {
  manual_seed(1);
  nn::MultiheadAttention seq_first(8, 2), batch_first(8, 2, 0.0, true, true);
  batch_first.load_state_dict(seq_first.state_dict());
  const Tensor x = randn({5, 3, 8});  // (L, N, E)
  const Tensor a = seq_first.forward(x);
  CHECK(a.shape() == Shape{5, 3, 8});
  KILN_CHECK_CLOSE(batch_first.forward(x.transpose(0, 1)).transpose(0, 1), a, 1e-6, 1e-6);
  // Parameters with torch's names and shapes.
  const nn::StateDict state = seq_first.state_dict();
  REQUIRE(state.size() == 4);
  CHECK(state[0].first == "in_proj_weight");
  CHECK(state[0].second.shape() == Shape{24, 8});
  CHECK(state[1].first == "in_proj_bias");
  CHECK(state[2].first == "out_proj.weight");
  // A key-padding mask (true = ignore) equals dropping those keys.
  std::vector<uint8_t> pad(15, 0);
  pad[3] = pad[4] = 1;  // sample 0: keys 3 and 4 are padding
  const Tensor padding = tensor<uint8_t>(pad, {3, 5}).to(DType::b8);
  const Tensor masked = seq_first.forward(x, x, x, padding);
  const Tensor short_keys = x.narrow(0, 0, 3).narrow(1, 0, 1);
  const Tensor expected = seq_first.forward(x.narrow(1, 0, 1), short_keys, short_keys);
  KILN_CHECK_CLOSE(masked.narrow(1, 0, 1), expected, 1e-5, 1e-5);
  // attn_mask true = may not attend: a causal mask equals is_causal.
  const Tensor future = gt(triu(ones({5, 5}), 1), 0.0);
  KILN_CHECK_CLOSE(seq_first.forward(x, x, x, Tensor(), future), seq_first.forward(x, x, x, Tensor(), Tensor(), true),
                   1e-6, 1e-6);
  // is_causal together with a padding mask keeps both.
  const Tensor both = seq_first.forward(x, x, x, padding, Tensor(), true);
  KILN_CHECK_CLOSE(both.narrow(0, 0, 2), seq_first.forward(x, x, x, Tensor(), Tensor(), true).narrow(0, 0, 2), 1e-5, 1e-5);
  CHECK(error_of([&] { nn::MultiheadAttention(10, 3); }).find("multiple of num_heads") != std::string::npos);
  CHECK(error_of([&] { seq_first.forward(x, x, x, padding.narrow(0, 0, 2)); }).find("key_padding_mask of shape") !=
        std::string::npos);
}

TEST_CASE("TransformerEncoderLayer and TransformerDecoderLayer register torch's modules and learn a copy task") {
  manual_seed(2);
  nn::TransformerLayerOptions options;
  options.dim_feedforward = 32;
  options.dropout = 0.0;
  options.batch_first = true;
  options.norm_first = true;
  nn::TransformerEncoderLayer encoder(16, 4, options);
  nn::TransformerDecoderLayer decoder(16, 4, options);
  std::vector<std::string> names;
  for (auto& [name, tensor] : decoder.state_dict()) names.push_back(name);
  CHECK(names.front() == "self_attn.in_proj_weight");
  CHECK(std::find(names.begin(), names.end(), "multihead_attn.out_proj.bias") != names.end());
  CHECK(std::find(names.begin(), names.end(), "norm3.weight") != names.end());
  // Learn to give every target position the mean of the memory: only the
  // cross-attention sees the memory.
  const Tensor memory = randn({8, 6, 16}), tgt = randn({8, 5, 16});
  const Tensor wanted = mean(memory, {1}, true).expand({8, 5, 16});
  std::vector<Tensor> params = encoder.parameters();
  for (const Tensor& p : decoder.parameters()) params.push_back(p);
  optim::AdamW optimizer(params, [] {
    optim::AdamWOptions o;
    o.lr = 1e-2;
    return o;
  }());
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    optimizer.zero_grad();
    const Tensor encoded = encoder.forward(memory);
    const Tensor out = decoder.forward(tgt, encoded, Tensor(), Tensor(), Tensor(), Tensor(), true);
    Tensor loss = mean(pow(sub(out, wanted), 2.0));
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  MESSAGE("memory-mean task loss " << first << " -> " << last);
  CHECK(last < 0.25 * first);
}

TEST_CASE("GPT: nanoGPT's names, a tied head, two parameter groups, causality") {
  manual_seed(3);
  nn::GPT gpt(tiny_gpt());
  // The head is the token embedding: one parameter, two state_dict names.
  CHECK(gpt.lm_head->weight.same(gpt.wte->weight));
  int tied = 0;
  for (const Tensor& p : gpt.parameters()) tied += p.same(gpt.wte->weight);
  CHECK(tied == 1);
  const nn::StateDict state = gpt.state_dict();
  int names = 0;
  for (auto& [name, tensor] : state) names += name == "transformer.wte.weight" || name == "lm_head.weight";
  CHECK(names == 2);
  // 17*16 + 12*16 + 2 blocks * (2*16*2 + 16*48+48 + 16*16+16 + 16*64+64 + 64*16+16) + 2*16 (ln_f)
  CHECK(gpt.parameter_count() == 17 * 16 + 12 * 16 + 2 * (4 * 16 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16) + 32);
  // Decay on matrices and embeddings, none on biases and LayerNorm weights.
  const std::vector<Tensor> decay = gpt.decay_parameters(), no_decay = gpt.no_decay_parameters();
  CHECK(decay.size() + no_decay.size() == gpt.parameters().size());
  for (const Tensor& p : decay) CHECK(p.dim() >= 2);
  for (const Tensor& p : no_decay) CHECK(p.dim() == 1);
  // Causal: changing a later token leaves the earlier logits unchanged.
  gpt.eval();
  Tensor idx = randint(0, 17, {2, 10});
  const Tensor logits = gpt.forward(idx);
  CHECK(logits.shape() == Shape{2, 10, 17});
  Tensor changed = idx.clone();
  changed.narrow(1, 9, 1).fill_(3.0);
  changed.narrow(1, 8, 1).fill_(5.0);
  KILN_CHECK_CLOSE(gpt.forward(changed).narrow(1, 0, 8), logits.narrow(1, 0, 8), 1e-6, 1e-6);
  CHECK(error_of([&] { gpt.forward(randint(0, 17, {1, 13})); }).find("longer than block_size 12") != std::string::npos);
  CHECK(error_of([] { nn::GPTConfig::named("gpt5"); }).find("known: gpt2-124m") != std::string::npos);
  // Initial loss near ln(vocab), as for any untrained language model.
  const double loss = gpt.loss(logits, randint(0, 17, {2, 10})).item<double>();
  CHECK(loss == doctest::Approx(std::log(17.0)).epsilon(0.15));
}

TEST_CASE("GPT: GPT-2 124M's configuration has its 124,439,808 parameters") {
  const nn::GPTConfig c = nn::GPTConfig::named("gpt2-124m");
  CHECK(c.vocab_size == 50257);
  CHECK(c.block_size == 1024);
  nn::GPT gpt(c);
  CHECK(gpt.parameter_count() == 124439808);
}

TEST_CASE("GPT: learns a sequence, and samples it back greedily and with top-k") {
  manual_seed(4);
  nn::GPT gpt(tiny_gpt());
  // The sequence 0, 1, ..., 11 shifted by one: after training, token t predicts t + 1.
  const Tensor seq = arange(0, 12, 1, {.dtype = DType::i64}).reshape({1, 12});
  const Tensor inputs = seq.narrow(1, 0, 11), targets = seq.narrow(1, 1, 11);
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.0;
  optim::AdamW optimizer(gpt.parameters(), o);
  gpt.train();
  double loss = 0;
  for (int step = 0; step < 150; ++step) {
    optimizer.zero_grad();
    Tensor l = gpt.loss(gpt.forward(inputs), targets);
    l.backward();
    optimizer.step();
    loss = l.item<double>();
  }
  CHECK(loss < 0.05);
  const Tensor prompt = arange(0, 3, 1, {.dtype = DType::i64}).reshape({1, 3});
  manual_seed(5);
  const Tensor greedy = gpt.generate(prompt, 6, 1.0, /*top_k=*/1);
  CHECK(greedy.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  manual_seed(5);
  const Tensor sampled = gpt.generate(prompt, 6, 0.5, /*top_k=*/3);
  CHECK(sampled.shape() == Shape{1, 9});
  CHECK(gpt.is_training());  // generate restores the mode
}

TEST_CASE("ViT: patches, a class token and position embeddings give logits, and it learns") {
  manual_seed(6);
  nn::ViTConfig c;
  c.patch_size = 7;
  c.dim = 32;
  c.depth = 2;
  c.mlp_dim = 64;
  nn::ViT vit(c);
  CHECK(vit.pos_embed.shape() == Shape{1, 17, 32});
  // Two classes told apart by brightness: the top half of the image or the bottom.
  const Tensor top = cat({ones({16, 1, 14, 28}), zeros({16, 1, 14, 28})}, 2);
  const Tensor bottom = cat({zeros({16, 1, 14, 28}), ones({16, 1, 14, 28})}, 2);
  const Tensor images = cat({top, bottom}, 0);
  const Tensor labels = cat({zeros({16}, {.dtype = DType::i64}), ones({16}, {.dtype = DType::i64})}, 0);
  optim::AdamWOptions o;
  o.lr = 3e-3;
  optim::AdamW optimizer(vit.parameters(), o);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    optimizer.zero_grad();
    Tensor loss = cross_entropy(vit.forward(images), labels);
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < 0.1 * first);
  CHECK(error_of([&] { vit.forward(zeros({1, 1, 32, 32})); }).find("ViT: expected images") != std::string::npos);
}

TEST_CASE("transformer models on CUDA match the CPU [gpu]") {
  KILN_REQUIRE_GPU();
  manual_seed(7);
  nn::GPT cpu(tiny_gpt()), gpu(tiny_gpt());
  gpu.load_state_dict(cpu.state_dict());
  gpu.to(Device::cuda());
  const Tensor idx = randint(0, 17, {3, 12});
  KILN_CHECK_CLOSE(gpu.forward(idx.cuda()).cpu(), cpu.forward(idx), 1e-4, 1e-4);
  nn::ViTConfig c;
  c.patch_size = 7;
  c.dim = 64;
  c.depth = 2;
  c.heads = 2;
  nn::ViT vit_cpu(c), vit_gpu(c);
  vit_gpu.load_state_dict(vit_cpu.state_dict());
  vit_gpu.to(Device::cuda());
  const Tensor images = randn({4, 1, 28, 28});
  KILN_CHECK_CLOSE(vit_gpu.forward(images.cuda()).cpu(), vit_cpu.forward(images), 1e-4, 1e-4);
}

}  // namespace kiln::testing
