#!/usr/bin/env python3
"""GEMM TFLOP/s of kiln (build/bin/bench_gemm --gpu --json) against torch.matmul
on the same GPU in one run (issue 20), as a Markdown table.

Runs bench_gemm's GPU part, which times kernels::gemm_cuda (cuBLASLt) in
float32, TF32, bfloat16 and float16 on a few shapes and prints one JSON row per
(precision, shape), then times torch.matmul on exactly those rows the way
bench_gemm does: the same m, n, k and dtype, a transposed operand stored
transposed and passed as a .t() view, C preallocated (out=), random normal
inputs rotated through enough sets to exceed twice the L2, the same warm-up
count, CUDA events around each call and the median of the same number of
repeats. torch.backends.cuda.matmul.allow_tf32 is True for the tf32 rows only;
float16/bfloat16 keep torch's defaults for reduced-precision split-K
reductions (printed in the header; kiln always reduces split-K partials in
float32). TFLOP/s counts 2 m n k on both sides.

    python3 bench/compare_gemm.py [--kiln build/bin/bench_gemm]
    /usr/bin/python3 bench/compare_gemm.py --rows rows.jsonl --device cpu   # smoke test of the torch side

--rows reads bench_gemm's JSON rows from a file instead of running it;
--device cpu times torch on the CPU with time.perf_counter (a smoke test only:
tf32 rows are skipped, and float16 rows where the CPU torch cannot matmul it).
KILN_COMMIT, when set, names the commit in the header.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"float32": torch.float32, "tf32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def fail(message):
    sys.exit(f"compare_gemm: {message}")


def kiln_rows(args):
    """bench_gemm's JSON rows, from --rows or from running --kiln --gpu --json."""
    if args.rows:
        with open(args.rows) as f:
            text, source = f.read(), args.rows
    else:
        command = [args.kiln, "--gpu", "--json"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        except OSError as error:
            fail(f"cannot run {args.kiln}: {error}")
        if result.returncode != 0:
            fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}{result.stdout}")
        text, source = result.stdout, " ".join(command)
    rows = []
    for line in text.splitlines():
        if not line.startswith("{"):
            continue  # e.g. the CPU part's text table
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            fail(f"{source}: not a JSON row ({error}): {line}")
        if "skipped" in row:
            fail(f"{source}: bench_gemm skipped its GPU part ({row['skipped']}); nothing to compare")
        rows.append(row)
    if not rows:
        fail(f"{source}: no JSON rows (expected bench_gemm --gpu --json output)")
    return rows


def median(values):
    return sorted(values)[len(values) // 2]  # bench_gemm's median: the upper one of an even count


def sets_for(row, element_bytes, l2_bytes):
    """As bench_gemm: enough (A, B, C) sets to exceed twice the L2, 1 to 8."""
    set_bytes = (row["m"] * row["k"] + row["k"] * row["n"] + row["m"] * row["n"]) * element_bytes
    return min(max(2 * l2_bytes // set_bytes + 1, 1), 8)


def time_row(row, device, l2_bytes):
    """Median milliseconds of torch.matmul on the row's problem."""
    m, n, k, dtype = row["m"], row["n"], row["k"], DTYPES[row["precision"]]
    flops = 2.0 * m * n * k
    warmup = row.get("warmup", 5)
    repeats = row.get("repeats", min(max(int(2e14 / flops), 20), 200))
    if device == "cuda":
        sets = sets_for(row, torch.tensor([], dtype=dtype).element_size(), l2_bytes)
    else:
        sets = row.get("sets", 1)  # no cache size to read on the CPU: kiln's count
    a_shape = (k, m) if row["trans_a"] else (m, k)
    b_shape = (n, k) if row["trans_b"] else (k, n)
    a_stored = [torch.randn(a_shape, device=device, dtype=dtype) for _ in range(sets)]
    b_stored = [torch.randn(b_shape, device=device, dtype=dtype) for _ in range(sets)]
    a = [x.t() if row["trans_a"] else x for x in a_stored]
    b = [x.t() if row["trans_b"] else x for x in b_stored]
    c = [torch.empty((m, n), device=device, dtype=dtype) for _ in range(sets)]

    def call(i):
        torch.matmul(a[i % sets], b[i % sets], out=c[i % sets])

    for i in range(warmup):
        call(i)
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(repeats):
            start.record()
            call(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for i in range(repeats):
            begin = time.perf_counter()
            call(i)
            times.append((time.perf_counter() - begin) * 1e3)
    return median(times)


def cpu_half_matmul_works():
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
        return True
    except RuntimeError:
        return False


def flag(owner, name):
    try:
        return getattr(owner, name)
    except (AttributeError, AssertionError):  # torch.backends.cuda.matmul asserts on names it does not know
        return "n/a"


def tflops_text(tflops):
    return f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "bench_gemm"))
    parser.add_argument("--rows", help="read bench_gemm's JSON rows from this file instead of running --kiln")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="where torch runs; cpu is a smoke test of this script (perf_counter, no tf32)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no GPU (torch.cuda.is_available() is False)")
    rows = kiln_rows(args)

    notes = []
    kiln_device = rows[0].get("device", "?")
    if args.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        torch_device = properties.name
        l2_bytes = getattr(properties, "L2_cache_size", 0) or rows[0].get("l2_bytes", 0)
        if torch_device != kiln_device:
            notes.append(f"kiln ran on {kiln_device!r}, torch on {torch_device!r}")
    else:
        torch_device, l2_bytes = "CPU", 0
    half_ok = args.device == "cuda" or cpu_half_matmul_works()
    matmul = torch.backends.cuda.matmul
    reduced = {name: flag(matmul, f"allow_{name}_reduced_precision_reduction") for name in ("fp16", "bf16")}

    table, skipped = [], {}
    allow_tf32 = matmul.allow_tf32
    try:
        for row in rows:
            precision = row["precision"]
            if precision not in DTYPES:
                fail(f"unknown precision {precision!r} in {row}")
            if args.device == "cpu" and precision == "tf32":
                skipped[precision] = "no TF32 on the CPU"
                continue
            if precision == "float16" and not half_ok:
                skipped[precision] = f"torch {torch.__version__} cannot matmul float16 on the CPU"
                continue
            matmul.allow_tf32 = precision == "tf32"
            torch_ms = time_row(row, args.device, l2_bytes)
            flops = 2.0 * row["m"] * row["n"] * row["k"]
            table.append((row, flops / (torch_ms * 1e-3) / 1e12))
    finally:
        matmul.allow_tf32 = allow_tf32

    commit = os.environ.get("KILN_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=ROOT).stdout.strip() or "?"
        except OSError:
            commit = "?"
    cuda_version = f" (CUDA {torch.version.cuda})" if torch.version.cuda else ""
    print(f"{datetime.date.today()} · kiln on {kiln_device} · torch {torch.__version__}{cuda_version} on "
          f"{torch_device} · commit {commit}")
    cpu_note = "; torch timed on the CPU with perf_counter (smoke test)" if args.device == "cpu" else ""
    print(f"GEMM C = op(A) @ op(B), TFLOP/s = 2 m n k / median; kiln: kernels::gemm_cuda (cuBLASLt, float32 "
          f"accumulation, split-K reduced in float32); torch: torch.matmul(out=), allow_tf32 for the tf32 rows only, "
          f"allow_fp16_reduced_precision_reduction {reduced['fp16']}, allow_bf16_reduced_precision_reduction "
          f"{reduced['bf16']}{cpu_note}\n")
    print("| precision | shape | m | n | k | kiln TFLOP/s | torch TFLOP/s | kiln/torch |")
    print("|---|---|---|---|---|---|---|---|")
    for row, torch_tflops in table:
        shape = f"{row['what']} (A{'^T' if row['trans_a'] else ''} @ B{'^T' if row['trans_b'] else ''})"
        print(f"| {row['precision']} | {shape} | {row['m']} | {row['n']} | {row['k']} | {tflops_text(row['tflops'])} | "
              f"{tflops_text(torch_tflops)} | {row['tflops'] / torch_tflops:.2f} |")
    notes += [f"{precision} rows skipped: {why}" for precision, why in skipped.items()]
    if notes:
        print()
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
