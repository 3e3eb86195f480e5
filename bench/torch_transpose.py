"""PyTorch's peer of bench_kernels' transpose rows on the CPU (2 threads):
x.t().contiguous() and out.copy_(x.t()) for the square matrices bench_kernels
uses (1024 x 1024 with --quick, 4096 x 4096 without), float32 and bfloat16,
with x.clone() as torch's own copy reference. Median of --repeats runs, the
last-level cache flushed before each as bench_kernels' harness does.

    /usr/bin/python3 bench/torch_transpose.py [--quick] [--repeats N]
"""
import argparse
import os
import statistics
import time

import torch


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    n = 1024 if args.quick else 4096
    repeats = args.repeats or (20 if args.quick else 10)
    print(f"{'op':42s} {'shape':14s} {'dtype':9s} {'median (us)':>12s} {'GB/s':>7s} {'% clone':>8s}")
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(n, n).to(dtype)
        out = torch.empty(n, n, dtype=dtype)
        gigabytes = 2 * x.numel() * x.element_size() / 1e9
        clone = median_seconds(lambda: x.clone(), repeats)
        rows = [("clone (reference)", clone),
                ("transpose (contiguous of .t())", median_seconds(lambda: x.t().contiguous(), repeats)),
                ("transpose (copy_ of .t() into a tensor)", median_seconds(lambda: out.copy_(x.t()), repeats))]
        name = str(dtype).replace("torch.", "")
        for op, seconds in rows:
            print(f"{op:42s} {f'[{n}, {n}]':14s} {name:9s} {seconds * 1e6:12.1f} {gigabytes / seconds:7.1f}"
                  f" {clone / seconds * 100:7.1f}%")


if __name__ == "__main__":
    main()
