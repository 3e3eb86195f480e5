#!/usr/bin/env python3
"""The PyTorch side of the transformer training-step comparison
(bench/compare_transformers.py): the models and the step of
bench/bench_transformer.cpp, in PyTorch, on random inputs. Prints one JSON line.

vit: the README's torch.nn definition of kiln's nn::ViT (patch 4, width 96,
6 pre-norm nn.TransformerEncoderLayers, 4 heads, MLP 192, GELU). gpt / gpt2-124m:
nanoGPT's GPT (attention through F.scaled_dot_product_attention with
is_causal where torch has it, else the explicit causal softmax). The step:
forward, loss, backward, AdamW (lr 1e-3, betas (0.9, 0.95), weight decay 0.1),
zero_grad(set_to_none=True); autocast for the mixed precisions (a GradScaler
for 16-mixed); --compile wraps the model in torch.compile.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ViT(nn.Module):
    def __init__(self, image_size=28, patch_size=4, dim=96, depth=6, heads=4, mlp_dim=192, num_classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(1, dim, patch_size, stride=patch_size)
        patches = (image_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(dim, heads, mlp_dim, dropout=0.0, activation="gelu",
                                                                 batch_first=True, norm_first=True)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, images):
        patches = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(images), -1, -1), patches], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(x))[:, 0])


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = scores.softmax(-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        self.n_layer, self.block_size, self.n_embd = n_layer, block_size, n_embd

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit", choices=["vit", "gpt", "gpt2-124m"])
    parser.add_argument("--batch-size", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--profile-step", action="store_true",
                        help="after the warm-up, one more step between cudaProfilerStart and cudaProfilerStop "
                        "(for ncu --profile-from-start off: bench/profile_step.py)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    if args.model == "vit":
        batch = args.batch_size or 128
        model = ViT()
        inputs, targets = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        tokens_per_sample, attention = 50, 12.0 * 6 * 50 * 96
        loss_of = lambda out: F.cross_entropy(out, targets)  # noqa: E731
    else:
        small = args.model == "gpt"
        batch = args.batch_size or (16 if small else 8)
        vocab, block, layers, heads, width = (256, 128, 4, 4, 128) if small else (50257, 1024, 12, 12, 768)
        model = GPT(vocab, block, layers, heads, width)
        tokens = torch.randint(0, vocab, (batch, block + 1))
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        tokens_per_sample, attention = block, 12.0 * layers * block * width
        loss_of = lambda out: F.cross_entropy(out.view(-1, out.size(-1)), targets.view(-1))  # noqa: E731
    model.to(device)
    inputs, targets = inputs.to(device), targets.to(device)
    parameters = sum(p.numel() for p in model.parameters())
    step_model = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    low = torch.bfloat16 if args.precision == "bf16-mixed" else torch.float16
    scaler = torch.cuda.amp.GradScaler(enabled=args.precision == "16-mixed")

    mixed = args.precision != "32-true"

    def step():
        if mixed:
            with torch.autocast(device.type, dtype=low):
                loss = loss_of(step_model(inputs))
        else:
            loss = loss_of(step_model(inputs))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup_steps):
        step()
    if args.profile_step:
        if device.type != "cuda":
            parser.error("--profile-step brackets GPU work; give --accelerator gpu")
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        step()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    last = loss.item()
    seconds = time.perf_counter() - start
    samples = args.steps * batch / seconds
    print(json.dumps({"framework": "torch.compile" if args.compile else "torch", "torch": torch.__version__,
                      "model": args.model, "batch_size": batch, "steps": args.steps, "precision": args.precision,
                      "parameters": parameters, "ms_per_step": 1e3 * seconds / args.steps,
                      "samples_per_s": samples, "tokens_per_s": samples * tokens_per_sample,
                      "model_tflops": samples * tokens_per_sample * (6.0 * parameters + attention) / 1e12,
                      "loss": last}))


if __name__ == "__main__":
    main()
