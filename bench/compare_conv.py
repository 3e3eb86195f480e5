#!/usr/bin/env python3
"""kiln's GPU convolutions against torch's, side by side on one GPU in one run.

Runs build/bin/bench_conv_gpu --json (kiln::conv2d through cuDNN: ResNet-9's
convolutions at batch 512 and FashionCNN's at batch 64, 3x3 stride 1 pad 1, no
bias; bfloat16 NCHW and channels-last, float32 NCHW; each through cuDNN's
legacy API and its graph API, one row each), then times
torch.nn.functional.conv2d on exactly those rows the same way: cuDNN benchmark
mode on, torch.backends.cudnn.allow_tf32 as in kiln's row (kiln's default is
off), channels_last tensors (input, weight and output gradient) for the nhwc
rows, an input that requires grad; forward under no_grad, and forward +
backward as torch.autograd.grad of a fixed random output gradient for dx and
dweight; one untimed call of each, 3 warm-ups, then per repeat an L2 flush and
CUDA events around one call; the median of the repeats (as many as kiln's
row). TFLOP/s: 2 N Cout Cin kh kw Hout Wout forward, 3x that with the backward.
Prints one Markdown table for bench/RESULTS.md; ratio = kiln / torch
throughput (above 1: kiln is faster).

    python3 bench/compare_conv.py [--kiln build/bin/bench_conv_gpu] [--repeats N]
    /usr/bin/python3 bench/compare_conv.py --rows rows.jsonl --device cpu   # smoke test, no GPU

--rows reads kiln's rows from a JSON-lines file instead of running kiln
(--save-rows FILE writes them, for the record or a later --rows run);
--device cpu times torch on the CPU with time.perf_counter (a smoke test of
this script, not a figure). Exits non-zero when kiln fails or prints no rows,
when torch sees no GPU, or when a kiln row failed its correctness check (the
table is printed first). KILN_COMMIT names the commit in the header.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


def fail(message):
    sys.exit(f"compare_conv: {message}")


def parse_rows(lines, source):
    rows = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            fail(f"{source}: bad JSON line ({error}): {line[:200]}")
    skipped = [row for row in rows if row.get("skipped")]
    if skipped:
        fail(f"{source} skipped its rows: {skipped[0].get('reason', 'no reason given')}")
    if not rows:
        fail(f"{source} printed no rows")
    return rows


def kiln_rows(args):
    if args.rows:
        with open(args.rows) as f:
            return parse_rows(f, args.rows)
    command = [args.kiln, "--json"] + (["--repeats", str(args.repeats)] if args.repeats else [])
    try:
        result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=args.timeout)
    except FileNotFoundError:
        fail(f"{args.kiln} not found (build it: cmake --build build --target bench_conv_gpu)")
    except subprocess.TimeoutExpired:
        fail(f"{' '.join(command)} ran past {args.timeout} s")
    lines = result.stdout.splitlines()
    if result.returncode != 0 and not any(line.startswith("{") for line in lines):
        fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}")
    rows = parse_rows(lines, " ".join(command))
    if result.returncode != 0:  # rows that failed carry "error"; the table shows them
        print(f"compare_conv: kiln exited {result.returncode}:\n{result.stderr}", file=sys.stderr)
    return rows


def forward_flops(row):
    out_h = (row["h"] + 2 * row.get("padding", 1) - row["kernel"]) // row.get("stride", 1) + 1
    out_w = (row["w"] + 2 * row.get("padding", 1) - row["kernel"]) // row.get("stride", 1) + 1
    return 2.0 * row["n"] * row["c_out"] * row["c_in"] * row["kernel"] ** 2 * out_h * out_w


class CudaTimer:
    """kiln's bench::GpuTimer: warm-ups, then per repeat an L2 flush and CUDA events around one call."""

    def __init__(self):
        l2_bytes = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 64 << 20
        self.flush = torch.empty(2 * max(l2_bytes, 1 << 20), dtype=torch.uint8, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def time_ms(self, fn, repeats, warmup=3):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for i in range(repeats):
            self.flush.fill_(i & 0xFF)
            self.start.record()
            fn()
            self.end.record()
            self.end.synchronize()
            times.append(self.start.elapsed_time(self.end))
        return statistics.median(times)


class CpuTimer:
    """A smoke-test stand-in: wall time with time.perf_counter."""

    def time_ms(self, fn, repeats, warmup=1):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)


def time_torch(row, device, timer, repeats):
    dtype = DTYPES[row["dtype"]]
    stride, padding = row.get("stride", 1), row.get("padding", 1)
    torch.backends.cudnn.allow_tf32 = bool(row.get("tf32", False))
    layout = torch.channels_last if row["layout"] == "nhwc" else torch.contiguous_format
    out_h = (row["h"] + 2 * padding - row["kernel"]) // stride + 1
    out_w = (row["w"] + 2 * padding - row["kernel"]) // stride + 1

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype).contiguous(memory_format=layout)

    x = randn(row["n"], row["c_in"], row["h"], row["w"]).requires_grad_()  # (N, Cin, H, W)
    w = randn(row["c_out"], row["c_in"], row["kernel"], row["kernel"]).requires_grad_()  # (Cout, Cin, kh, kw)
    dy = randn(row["n"], row["c_out"], out_h, out_w)  # (N, Cout, Hout, Wout)

    def forward():
        with torch.no_grad():
            F.conv2d(x, w, None, stride, padding)

    def forward_backward():
        torch.autograd.grad(F.conv2d(x, w, None, stride, padding), (x, w), dy)

    forward()  # untimed: cuDNN's benchmark search
    forward_backward()
    flops = forward_flops(row)
    forward_ms = timer.time_ms(forward, repeats)
    both_ms = timer.time_ms(forward_backward, repeats)
    return {"forward_ms": forward_ms, "forward_backward_ms": both_ms, "forward_tflops": flops / forward_ms * 1e-9,
            "forward_backward_tflops": 3 * flops / both_ms * 1e-9}


def commit():
    if os.environ.get("KILN_COMMIT"):
        return os.environ["KILN_COMMIT"]
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return result.stdout.strip() or "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "bench_conv_gpu"))
    parser.add_argument("--rows", help="read kiln's rows from this JSON-lines file instead of running kiln")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke test only")
    parser.add_argument("--repeats", type=int, default=0, help="repeats for kiln and torch (0: kiln's default)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds kiln may run")
    parser.add_argument("--save-rows", help="also write kiln's rows (JSON lines) to this file")
    args = parser.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no GPU (built with CUDA {torch.version.cuda}); "
             "--device cpu runs the smoke test")
    rows = kiln_rows(args)
    if args.save_rows:
        with open(args.save_rows, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    if args.device == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cudnn.benchmark = True
        timer = CudaTimer()
        device_name = torch.cuda.get_device_name(0)
        backend = f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
    else:
        timer = CpuTimer()
        device_name = f"CPU {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"
        backend = "CPU smoke test, not a figure"
    kiln_devices = sorted({row["device"] for row in rows if "device" in row})
    if args.device == "cuda" and kiln_devices and kiln_devices != [device_name]:
        print(f"compare_conv: warning: kiln ran on {', '.join(kiln_devices)}, torch on {device_name}", file=sys.stderr)

    # kiln gives one row per cuDNN API (legacy, graph) for each problem: torch times each problem once.
    torch_rows, torch_by_problem = [], {}
    for row in rows:
        repeats = args.repeats or row.get("repeats", 20)
        problem = tuple(row.get(k) for k in ("what", "n", "c_in", "c_out", "h", "w", "dtype", "layout", "tf32"))
        if problem not in torch_by_problem:
            try:
                torch_by_problem[problem] = time_torch(row, args.device, timer, repeats)
            except RuntimeError as error:  # e.g. a dtype the CPU lacks in the smoke test
                torch_by_problem[problem] = {"error": str(error).splitlines()[0]}
        torch_rows.append(torch_by_problem[problem])

    tf32 = sorted({bool(row.get("tf32", False)) for row in rows if row["dtype"] == "float32"})
    tf32_text = {(): "no float32 rows", (False,): "off", (True,): "on"}.get(tuple(tf32), "mixed")
    repeats_text = args.repeats or "/".join(str(r) for r in sorted({row.get("repeats", 20) for row in rows}))
    print(f"{datetime.date.today()} · {device_name} · torch {torch.__version__} ({backend}) · commit {commit()}")
    method = (f"cuDNN benchmark mode, median of {repeats_text} after warm-up with the L2 flushed"
              if args.device == "cuda" else f"torch on the CPU, median of {repeats_text} (kiln's rows as given)")
    print(f"kiln::conv2d vs torch.nn.functional.conv2d, {method}; fwd+bwd = forward + dx + dweight (3x the forward "
          f"FLOPs); float32 TF32 {tf32_text} in both; TFLOP/s, ratio = kiln / torch (above 1: kiln faster)\n")
    print("| shape | dtype | layout | kiln's cuDNN API | kiln fwd TFLOP/s | torch fwd | ratio | kiln fwd+bwd | "
          "torch fwd+bwd | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    kiln_failed = False
    ratios = {}  # (dtype, layout) -> [(fwd ratio, fwd+bwd ratio)]

    def cell(value):
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 0.1 else f"{value:.3g}"

    for row, peer in zip(rows, torch_rows):
        shape = f"{row['what']} {row['c_in']}->{row['c_out']} {row['h']}x{row['w']} n{row['n']}"
        layout = row["layout"]
        if row.get("cudnn_layout", layout) != layout:
            layout += f" (kiln ran {row['cudnn_layout']})"
        api = row.get("cudnn_api", "legacy")
        api_text = api + (f" ({row['graph_fallbacks']} of 3 ran legacy)" if row.get("graph_fallbacks") else "")
        if "error" in row:
            kiln_failed = True
            kiln_fwd, kiln_both = f"kiln failed: {row['error'].replace('|', '/')[:120]}", "failed"
        else:
            kiln_fwd, kiln_both = cell(row["forward_tflops"]), cell(row["forward_backward_tflops"])
        if "error" in peer:
            torch_fwd, torch_both = f"torch failed: {peer['error'].replace('|', '/')[:120]}", "failed"
        else:
            torch_fwd, torch_both = cell(peer["forward_tflops"]), cell(peer["forward_backward_tflops"])
        if "error" in row or "error" in peer:
            ratio_fwd = ratio_both = "—"
        else:
            fwd = row["forward_tflops"] / peer["forward_tflops"]
            both = row["forward_backward_tflops"] / peer["forward_backward_tflops"]
            ratios.setdefault((row["dtype"], row["layout"], api), []).append((fwd, both))
            ratio_fwd, ratio_both = f"{fwd:.2f}", f"{both:.2f}"
        print(f"| {shape} | {row['dtype']} | {layout} | {api_text} | {kiln_fwd} | {torch_fwd} | {ratio_fwd} | {kiln_both} | "
              f"{torch_both} | {ratio_both} |")

    def geomean(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    print()
    for (dtype, layout, api), pairs in ratios.items():
        print(f"{dtype} {layout}, kiln's cuDNN {api} API: geometric mean of kiln / torch over {len(pairs)} shape(s): forward "
              f"{geomean([p[0] for p in pairs]):.2f}, forward+backward {geomean([p[1] for p in pairs]):.2f}")
    if kiln_failed:
        fail("kiln rows failed (see the table)")


if __name__ == "__main__":
    main()
