#!/usr/bin/env python3
"""PyTorch's side of bench/bench_attention.cpp on a GPU: torch's
scaled_dot_product_attention (its flash backend for 16-bit inputs) on the same
shapes (batch 16384 / T, 2048 / D heads, T 1024 to 4096, D 64 and 128, causal
and not), forward and forward + backward, timed with CUDA events (median of
--repeats after warm-ups), printed as a Markdown table with TFLOP/s counted as
bench_attention counts them (4 B H T^2 D forward, 3.5x that with the backward,
half of each when causal).

    python3 bench/torch_attention.py [--dtype bf16|f16] [--repeats 20]
"""
import argparse

import torch
import torch.nn.functional as F


def time_ms(fn, repeats):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.dtype}\n")
    print("| shape | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("|---|---|---|---|---|")
    for T in (1024, 2048, 4096):
        for D in (64, 128):
            for causal in (False, True):
                B, H = 16384 // T, 2048 // D
                q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
                dout = torch.randn_like(q)
                flops = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
                with torch.no_grad():
                    forward = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.repeats)
                # autograd.grad, not .backward(): no accumulation into q.grad, k.grad and v.grad at
                # every repeat (bench_attention.cpp alike): the attention alone is timed.
                both = time_ms(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                                           (q, k, v), dout), args.repeats)
                shape = f"B{B} H{H} T{T} D{D}{' causal' if causal else ''}"
                print(f"| {shape} | {forward:.3f} | {flops / forward * 1e-9:.1f} | {both:.3f} | "
                      f"{3.5 * flops / both * 1e-9:.1f} |")


if __name__ == "__main__":
    main()
