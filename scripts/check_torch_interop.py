#!/usr/bin/env python3
"""PyTorch's side of tests/test_torch_interop.cpp: kiln weights load into the
equivalent torch.nn model and back.

    check_torch_interop.py DIR MODEL

reads DIR/kiln_weights.safetensors (a kiln state_dict) and DIR/kiln_io.safetensors
(the inputs and kiln's outputs), loads the weights into the torch.nn
definition of MODEL with strict=True, and checks that torch computes the same
outputs. MODEL is cnn or mlp (as in the README; eval-mode logits of "input"),
or vit or gpt (the README's definitions of nn::ViT and nn::GPT, small
configurations), or one of the transformer layers: encoder (TransformerEncoderLayer, post-norm,
relu, sequence first, a float attention mask), encoder_prenorm (norm_first,
gelu, batch_first, a bool key-padding mask), decoder (TransformerDecoderLayer,
norm_first, gelu, batch_first, a bool causal mask and a memory padding mask),
all with dropout 0 and compared in train mode (torch's inference fast path
stays out). Then it trains the torch model one SGD step (so weights and
BatchNorm statistics change), and writes DIR/torch_weights.safetensors and
DIR/torch_io.safetensors (the same inputs and torch's new outputs) for kiln to
load and check. Safetensors files are
read and written here by hand (the format is a JSON header and raw bytes), so
nothing beyond torch is needed. Exits non-zero with a message on any mismatch.
"""
import json
import struct
import sys

import torch
import torch.nn as nn

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}
NAMES = {value: key for key, value in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
    body = data[8 + header_size:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[info["dtype"]])
        tensors[name] = flat.reshape(info["shape"]).clone()
    return tensors


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        raw = tensor.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


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


def main():
    folder, model_name = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    classifier = model_name in ("cnn", "mlp")
    if classifier:
        model = FashionCNN() if model_name == "cnn" else MLP()
        run = lambda io: model(io["input"])  # noqa: E731
    else:
        model, run = transformer(model_name)
    weights = read_safetensors(f"{folder}/kiln_weights.safetensors")
    model.load_state_dict(weights, strict=True)  # raises, listing the keys, on any mismatch
    io = read_safetensors(f"{folder}/kiln_io.safetensors")
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
    write_safetensors(f"{folder}/torch_weights.safetensors", model.state_dict())
    write_safetensors(f"{folder}/torch_io.safetensors", dict(io, output=new_output))
    print(f"torch -> kiln: wrote {len(model.state_dict())} tensors after one SGD step")


if __name__ == "__main__":
    main()
