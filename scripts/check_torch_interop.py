#!/usr/bin/env python3
"""PyTorch's side of tests/test_torch_interop.cpp: kiln weights load into the
equivalent torch.nn model and back.

    check_torch_interop.py DIR MODEL

reads DIR/kiln_weights.safetensors (a kiln state_dict) and DIR/kiln_io.safetensors
(the inputs and kiln's outputs), loads the weights into the torch.nn
definition of MODEL with strict=True, and checks that torch computes the same
outputs. MODEL is cnn or mlp (as in the README; eval-mode logits of "input"),
or vit or gpt (the README's definitions of nn::ViT and nn::GPT, small
configurations), or dtypes (below), or one of the transformer layers: encoder (TransformerEncoderLayer, post-norm,
relu, sequence first, a float attention mask), encoder_prenorm (norm_first,
gelu, batch_first, a bool key-padding mask), decoder (TransformerDecoderLayer,
norm_first, gelu, batch_first, a bool causal mask and a memory padding mask),
all with dropout 0 and compared in train mode (torch's inference fast path
stays out). Then it trains the torch model one SGD step (so weights and
BatchNorm statistics change), and writes DIR/torch_weights.safetensors and
DIR/torch_io.safetensors (the same inputs and torch's new outputs) for kiln to
load and check.

MODEL dtypes checks 16-bit tensors: kiln_weights.safetensors holds an MLP
state_dict in float16 ("f16.<name>") and bfloat16 ("bf16.<name>") and special
values ("<dtype>.special": signed zeros, infinities, NaN, the largest finite
value, a subnormal), kiln_io.safetensors the same values in float32. Each must
load with torch's dtype and exactly kiln's values, and each MLP state_dict
must load strictly into MLP().to(dtype); then torch writes
torch_weights.safetensors: every float32 value times 3, rounded by torch to the
tensor's 16-bit dtype, for kiln to compare bit for bit with its own rounding.

Files are read with safetensors.torch.load_file and written with save_file.
Exits non-zero with a message on any mismatch.
"""
import sys

import torch
import torch.nn as nn
# The loader the README tells users to call; the files are written with its
# counterpart, so every file of this check goes through the safetensors package.
from safetensors.torch import load_file, save_file

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


class FashionCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_features=784, hidden=256, num_classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                    nn.Linear(hidden, hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, num_classes))

    def forward(self, x):
        return self.layers(x)


class ViT(nn.Module):
    """kiln's nn::ViT (nn/models.h), the README's definition."""

    def __init__(self, image_size=28, patch_size=7, in_channels=1, num_classes=10, dim=32, depth=2, heads=4,
                 mlp_dim=64, dropout=0.0, emb_dropout=0.0):
        super().__init__()
        self.patch_embed = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        patches = (image_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, dim))
        self.emb_dropout = nn.Dropout(emb_dropout)
        self.blocks = nn.Sequential(*[
            nn.TransformerEncoderLayer(dim, heads, mlp_dim, dropout=dropout, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(images), -1, -1), patches], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(self.emb_dropout(x)))[:, 0])


class CausalSelfAttention(nn.Module):
    """nanoGPT's, with the causal mask computed rather than stored as a buffer."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (C // self.n_head) ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = scores.softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(nn.functional.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """kiln's nn::GPT: nanoGPT's module names, the head tied to the token embedding."""

    def __init__(self, vocab_size=65, block_size=16, n_layer=2, n_head=4, n_embd=32):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# The transformer models (d_model 32, 4 heads, feed-forward 64, dropout 0) and
# how each is called on the inputs kiln wrote.
def transformer(model_name):
    if model_name == "vit":
        model = ViT()
        return model, lambda io: model(io["input"])
    if model_name == "gpt":
        model = GPT()
        return model, lambda io: model(io["input"])
    if model_name == "encoder":
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0)
        return layer, lambda io: layer(io["input"], src_mask=io["mask"])
    if model_name == "encoder_prenorm":
        layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        return layer, lambda io: layer(io["input"], src_key_padding_mask=io["padding"])
    if model_name == "decoder":
        layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        return layer, lambda io: layer(io["input"], io["memory"], tgt_mask=io["mask"],
                                       memory_key_padding_mask=io["padding"])
    sys.exit(f"unknown model {model_name}")


def same_values(actual, expected):
    """Elementwise equal as float32, -0 apart from +0, NaN matching NaN."""
    actual, expected = actual.float(), expected.float()
    both_nan = actual.isnan() & expected.isnan()
    equal = (actual == expected) & (actual.signbit() == expected.signbit())
    return bool((both_nan | equal).all())


def check_dtypes(folder):
    weights = load_file(f"{folder}/kiln_weights.safetensors")
    reference = load_file(f"{folder}/kiln_io.safetensors")
    if set(weights) != set(reference):
        sys.exit(f"dtypes: the files name different tensors: {sorted(set(weights) ^ set(reference))}")
    for name, tensor in weights.items():
        dtype = DTYPES[name.split(".")[0]]
        if tensor.dtype != dtype:
            sys.exit(f"dtypes: {name} loaded as {tensor.dtype}, expected {dtype}")
        if reference[name].dtype != torch.float32 or not same_values(tensor, reference[name]):
            sys.exit(f"dtypes: {name} holds {tensor.flatten()[:8]}, kiln wrote {reference[name].flatten()[:8]}")
    for prefix, dtype in DTYPES.items():
        model = MLP().to(dtype)
        state = {name[len(prefix) + 1:]: t for name, t in weights.items() if name.startswith(prefix + ".")
                 and name != prefix + ".special"}
        model.load_state_dict(state, strict=True)
        if any(p.dtype != dtype for p in model.parameters()):
            sys.exit(f"dtypes: the {prefix} MLP's parameters are not {dtype} after loading")
    for prefix in DTYPES:
        special = weights[prefix + ".special"]
        if not (bool(special.isinf().any()) and bool(special.isnan().any()) and bool(special.signbit()[1])):
            sys.exit(f"dtypes: {prefix}.special lost its infinities, NaN or -0: {special}")
    save_file({name: (reference[name] * 3).to(weights[name].dtype) for name in weights},
              f"{folder}/torch_weights.safetensors")
    print(f"dtypes: {len(weights)} float16/bfloat16 tensors loaded with load_file, exact; "
          "two MLP state_dicts loaded strictly; torch's rounding of x*3 written")


def main():
    folder, model_name = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    if model_name == "dtypes":
        check_dtypes(folder)
        return
    classifier = model_name in ("cnn", "mlp")
    if classifier:
        model = FashionCNN() if model_name == "cnn" else MLP()
        run = lambda io: model(io["input"])  # noqa: E731
    else:
        model, run = transformer(model_name)
    weights = load_file(f"{folder}/kiln_weights.safetensors")
    model.load_state_dict(weights, strict=True)  # raises, listing the keys, on any mismatch
    io = load_file(f"{folder}/kiln_io.safetensors")
    expected = io.pop("output")
    model.eval() if classifier else model.train()
    with torch.no_grad():
        output = run(io)
    error = (output - expected).abs().max().item()
    print(f"kiln -> torch ({model_name}): {len(weights)} tensors loaded strictly, max |output difference| {error:.3g}")
    if not error < 1e-4:
        sys.exit(f"kiln -> torch: outputs differ by {error}")

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if classifier:
        loss = nn.functional.cross_entropy(run(io), torch.arange(len(io["input"])) % 10)
    else:
        loss = run(io).pow(2).mean()
    loss.backward()
    optimizer.step()
    model.eval() if classifier else model.train()
    with torch.no_grad():
        new_output = run(io)
    # save_file refuses tensors that share memory (GPT's tied head and
    # embedding); kiln's loader, like torch's, expects both names.
    state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, f"{folder}/torch_weights.safetensors")
    save_file({name: tensor.contiguous() for name, tensor in dict(io, output=new_output).items()},
              f"{folder}/torch_io.safetensors")
    print(f"torch -> kiln: wrote {len(model.state_dict())} tensors after one SGD step")


if __name__ == "__main__":
    main()
