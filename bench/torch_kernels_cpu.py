"""PyTorch's peers of bench_kernels' CPU rows that have one here (2 threads,
the last-level cache flushed before each repeat as bench_kernels' harness does;
median of --repeats runs):
  - transposes: x.t().contiguous() and out.copy_(x.t()) of the square matrix
    bench_kernels uses (1024 x 1024 with --quick, 4096 x 4096 without), with
    x.clone() as torch's own copy reference;
  - the convnet table's 2x2 max pool, forward and forward + backward, NCHW, on
    (batch, 128, 28, 28) (batch 16 with --quick, 128 without).
float32 and bfloat16.

    /usr/bin/python3 bench/torch_kernels_cpu.py [--quick] [--repeats N]
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F


def last_level_cache_bytes():
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if size > 0:
            return size
    return 32 << 20


# Twice the last-level cache, capped at 512 MiB (bench/harness.h's rule).
FLUSH = torch.empty(min(2 * last_level_cache_bytes(), 512 << 20), dtype=torch.uint8)


def median_seconds(fn, repeats):
    fn()
    times = []
    for i in range(repeats):
        FLUSH.fill_(i & 0xFF)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(op, shape, dtype, seconds, gigabytes, reference=None):
    name = str(dtype).replace("torch.", "")
    percent = f" {reference / seconds * 100:7.1f}%" if reference else ""
    print(f"{op:42s} {str(list(shape)):18s} {name:9s} {seconds * 1e6:12.1f} {gigabytes / seconds:7.1f}{percent}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    repeats = args.repeats or (20 if args.quick else 10)
    print(f"{'op':42s} {'shape':18s} {'dtype':9s} {'median (us)':>12s} {'GB/s':>7s} {'% clone':>8s}")
    n = 1024 if args.quick else 4096
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, n).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        gigabytes = 2 * x.numel() * x.element_size() / 1e9
        clone = median_seconds(lambda: x.clone(), repeats)
        row("clone (reference)", x.shape, dtype, clone, gigabytes, clone)
        row("transpose (contiguous of .t())", x.shape, dtype,
            median_seconds(lambda: x.t().contiguous(), repeats), gigabytes, clone)
        row("transpose (copy_ of .t() into a tensor)", x.shape, dtype,
            median_seconds(lambda: out.copy_(x.t()), repeats), gigabytes, clone)
    batch = 16 if args.quick else 128
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(batch, 128, 28, 28).to(dtype)
        dy = torch.randn(batch, 128, 14, 14).to(dtype)
        element = x.element_size()
        # bench_kernels' bytes: x read, y and its int64 (kiln: int32) indices written.
        fwd_bytes = (x.numel() * element + dy.numel() * (element + 4)) / 1e9
        with torch.no_grad():
            row("maxpool2 fwd NCHW", x.shape, dtype, median_seconds(lambda: F.max_pool2d(x, 2), repeats), fwd_bytes)
        xg = x.detach().requires_grad_()

        def forward_backward():
            xg.grad = None
            F.max_pool2d(xg, 2).backward(dy)

        row("maxpool2 fwd+bwd NCHW", x.shape, dtype, median_seconds(forward_backward, repeats), 2 * fwd_bytes)


if __name__ == "__main__":
    main()
