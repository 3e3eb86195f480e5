#!/usr/bin/env python3
"""Where one GPU training step spends its time, kernel by kernel, kiln against PyTorch.

Runs bench_transformer (kiln) and torch_transformer.py (PyTorch) for the
transformers (--model gpt2-124m, gpt, vit), or bench_fashion and
torch_fashion.py for the CNNs (--model resnet9, cnn: one iteration, batch
and copy included), with --profile-step, which brackets one step with
cudaProfilerStart/Stop, and times every kernel of that step on both sides with
one of two tracers:
  cupti (the default): bench/kernel_trace.cpp's CUPTI injection library
    (CUDA_INJECTION64_PATH), the same for both programs, which records each
    kernel, memcpy and memset as it runs, concurrency kept. Besides the sums it
    gives the step's window (cudaProfilerStart to Stop, the device synchronized
    at both ends) and the GPU's busy time in it (the union of the intervals):
    the rest is idle, launch and host overhead. Seconds per run.
  ncu: Nsight Compute (--profile-from-start off), one kernel at a time (ncu
    serializes them: the sum is the GPU's busy time without overlap; no window).
    Minutes per run: a GPT-2 step has thousands of kernels.
Prints a markdown table by kernel family and the longest kernels of each side:
the list of what to make faster first.

  python3 bench/profile_step.py --kiln build/bin/bench_transformer --python python3
  python3 bench/profile_step.py --model resnet9 --channels-last --kiln build/bin/bench_fashion --python python3
  python3 bench/profile_step.py --summarize kiln.csv [torch.csv]   # tables from saved traces or ncu CSVs
"""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

# Kernel families, first match wins (names as ncu prints them with --print-kernel-base function).
FAMILIES = [
    ("attention", r"attention|flash|fmha|sdpa|attn"),
    # cuDNN's convolution kernels (implicit GEMMs named fprop/dgrad/wgrad, layout transposes) before GEMM,
    # whose patterns (xmma, sm90_) their names share.
    ("convolution", r"conv(?!ert)|fprop|dgrad|wgrad|implicit|winograd|cudnn|nchwToNhwc|nhwcToNchw"),
    ("GEMM", r"gemm|xmma|cutlass|nvjet|matmul|cublas|sm90_|sm80_|ampere_|hopper"),
    ("layer_norm", r"layer_?norm|ln_(forward|grad)|rms_?norm"),
    ("batch_norm", r"batch_?norm|bn_"),
    ("pooling", r"pool"),
    ("softmax / cross_entropy", r"softmax|cross_entropy|nll_loss|log_softmax"),
    ("optimizer", r"adam|multi_tensor|fused_optim|foreach|lamb|sgd"),
    ("embedding / indexing", r"embedding|gather|index|scatter|dense_rows"),
    ("reduction", r"reduce|sum_|_sum|norm_kernel|amax|unscale|non_finite|inf"),
    ("dropout / random", r"dropout|philox|random|bernoulli"),
    ("copy / cast / fill", r"copy|memcpy|cast|convert|fill|memset|to_|contiguous"),
]
UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def family_of(name):
    for family, pattern in FAMILIES:
        if re.search(pattern, name, re.IGNORECASE):
            return family
    return "elementwise / other"


def parse_ncu_csv(text):
    """(kernel name, microseconds) per profiled kernel, from ncu --csv output."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        raise ValueError("no ncu CSV header (a line naming \"Kernel Name\" and \"Metric Value\") in the output")
    rows = csv.DictReader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"'))))
    kernels = []
    for row in rows:
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = (row.get("Metric Unit") or "nsecond").strip()
        if unit not in UNITS:
            raise ValueError(f"gpu__time_duration.sum in an unknown unit {unit!r}")
        value = float(row["Metric Value"].replace(",", ""))
        kernels.append((row["Kernel Name"], value * UNITS[unit]))
    return kernels


TRACE_HEADER = "# kiln_kernel_trace"


def parse_trace_csv(text):
    """kernel_trace.cpp's CSV: ((name, microseconds) per activity, [(start_ns, end_ns)], window_ns, dropped)."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith(TRACE_HEADER):
        raise ValueError(f"not a kernel trace: its first line does not start with {TRACE_HEADER!r}")
    fields = lines[0].split()
    try:
        start, end, dropped = int(fields[3]), int(fields[4]), int(fields[6])
    except (IndexError, ValueError):
        raise ValueError(f"kernel trace header {lines[0]!r}: expected 'window_ns START END dropped N'") from None
    if end <= start:
        raise ValueError("the kernel trace has no cudaProfilerStart ... cudaProfilerStop window "
                         "(did the program run with --profile-step?)")
    kernels, intervals = [], []
    for row in csv.DictReader(io.StringIO("\n".join(lines[1:]))):
        begin, finish = int(row["start_ns"]), int(row["end_ns"])
        kernels.append((short_name(row["name"]), (finish - begin) / 1e3))
        intervals.append((begin, finish))
    return kernels, intervals, end - start, dropped


def short_name(name):
    """A demangled kernel name without its parameter list and its leading "void "."""
    if name.endswith(")"):
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    return name[5:] if name.startswith("void ") else name


def busy_ns(intervals):
    """The length of the union of [start, end) intervals: the time at least one of them ran."""
    total, reach = 0, None
    for begin, finish in sorted(intervals):
        if reach is None or begin > reach:
            total += finish - begin
            reach = finish
        elif finish > reach:
            total += finish - reach
            reach = finish
    return total


def read_side(path):
    """(kernels, timing or None) of a saved kernel trace or ncu CSV."""
    with open(path) as f:
        text = f.read()
    if text.startswith(TRACE_HEADER):
        kernels, intervals, window, dropped = parse_trace_csv(text)
        return kernels, {"window_ns": window, "busy_ns": busy_ns(intervals), "dropped": dropped}
    return parse_ncu_csv(text), None


def summarize(kernels):
    families, names = {}, {}
    for name, us in kernels:
        for table, key in ((families, family_of(name)), (names, name)):
            count, total = table.get(key, (0, 0.0))
            table[key] = (count + 1, total + us)
    return families, names


def print_timing(sides):
    """sides: [(label, kernels, timing)], timing from a kernel trace (None from ncu)."""
    timed = [(label, timing) for label, _, timing in sides if timing is not None]
    if not timed:
        return
    print("| one step | " + " | ".join(label for label, _ in timed) + " |")
    print("|---" * (1 + len(timed)) + "|")
    print("| window, cudaProfilerStart to Stop (ms) | " +
          " | ".join(f"{t['window_ns'] / 1e6:.2f}" for _, t in timed) + " |")
    print("| GPU busy: union of the kernels, copies and sets (ms) | " +
          " | ".join(f"{t['busy_ns'] / 1e6:.2f}" for _, t in timed) + " |")
    print("| GPU idle in the window (launch and host overhead) | " +
          " | ".join(f"{100 * (1 - t['busy_ns'] / t['window_ns']):.1f}%" for _, t in timed) + " |")
    for label, t in timed:
        if t["dropped"]:
            print(f"\n**{label}: CUPTI dropped {t['dropped']} activity records: the sums above are short.**")
    print()


def print_tables(sides, top):
    """sides: [(label, kernels, timing)], timing None for an ncu CSV."""
    print_timing(sides)
    summaries = [(label, kernels, *summarize(kernels)) for label, kernels, _ in sides]
    header = "| kernel family | " + " | ".join(f"{label} ms (kernels)" for label, *_ in summaries) + " |"
    print(header)
    print("|---" * (1 + len(summaries)) + "|")
    order = sorted({f for *_, families, _ in summaries for f in families},
                   key=lambda f: -max(s[2].get(f, (0, 0.0))[1] for s in summaries))
    for family in order:
        cells = []
        for _, _, families, _ in summaries:
            count, total = families.get(family, (0, 0.0))
            cells.append(f"{total / 1e3:.2f} ({count})")
        print(f"| {family} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(us for _, us in kernels) / 1e3:.2f}** ({len(kernels)})" for _, kernels, *_ in summaries]
    print("| all kernels | " + " | ".join(totals) + " |")
    for label, kernels, _, names in summaries:
        print(f"\nLongest kernels, {label} (one step):\n")
        print("| kernel | family | calls | ms | share |")
        print("|---|---|---|---|---|")
        whole = sum(us for _, us in kernels) or 1.0
        for name, (count, total) in sorted(names.items(), key=lambda item: -item[1][1])[:top]:
            shown = name if len(name) <= 90 else name[:87] + "..."
            print(f"| `{shown}` | {family_of(name)} | {count} | {total / 1e3:.3f} | {100 * total / whole:.1f}% |")


def trace(label, command, library, csv_path):
    """(kernels, timing) of one run of command under kernel_trace.cpp's CUPTI injection library."""
    if not os.path.isfile(library):
        raise SystemExit(f"{label}: the kernel trace library {library} does not exist (build kiln_kernel_trace, "
                         "or give --trace-lib)")
    if os.path.exists(csv_path):
        os.remove(csv_path)  # a stale trace must not pass for this run's
    env = dict(os.environ, CUDA_INJECTION64_PATH=os.path.abspath(library), KILN_KERNEL_TRACE=csv_path)
    for kineto_switch in ("KINETO_USE_DAEMON", "TEARDOWN_CUPTI"):  # would start or end torch's own CUPTI use
        env.pop(kineto_switch, None)
    print(f"{label}: CUDA_INJECTION64_PATH={library} KILN_KERNEL_TRACE={csv_path} {' '.join(command)}",
          file=sys.stderr)
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if result.returncode != 0 or not os.path.exists(csv_path):
        sys.stderr.write(result.stdout[-4000:])
        raise SystemExit(f"{label}: the traced run exited with {result.returncode}"
                         f"{'' if os.path.exists(csv_path) else ' and wrote no trace'}")
    return read_side(csv_path)


def profile(label, command, ncu, csv_path):
    ncu_command = [ncu, "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum", "--csv",
                   "--print-units", "base", "--print-kernel-base", "function", "--clock-control", "none",
                   "--cache-control", "none", "--target-processes", "all", "--log-file", csv_path] + command
    print(f"{label}: {' '.join(ncu_command)}", file=sys.stderr)
    result = subprocess.run(ncu_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:])
        raise SystemExit(f"{label}: the profiled run exited with {result.returncode}")
    text = open(csv_path).read() if os.path.exists(csv_path) else ""
    if '"Kernel Name"' not in text:  # an ncu that printed the table to stdout despite --log-file
        text = result.stdout
        with open(csv_path, "w") as f:
            f.write(text)
    return parse_ncu_csv(text), None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", help="bench_transformer binary (bench_fashion for --model resnet9 or cnn)")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--tracer", default="cupti", choices=["cupti", "ncu"],
                        help="cupti: bench/kernel_trace.cpp's library (seconds; busy and idle time); ncu: Nsight "
                        "Compute, kernels serialized (minutes)")
    parser.add_argument("--trace-lib", help="the CUPTI injection library (default: libkiln_kernel_trace.so beside "
                        "--kiln)")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--model", default="gpt2-124m", choices=["vit", "gpt", "gpt2-124m", "resnet9", "cnn"])
    parser.add_argument("--batch-size", type=int, help="default: 16 (transformers), 512 (resnet9), 64 (cnn)")
    parser.add_argument("--channels-last", action="store_true", help="resnet9/cnn: model and images channels-last")
    parser.add_argument("--precision", default="bf16-mixed", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--out-dir", default=".", help="where the traces (CSV files) go")
    parser.add_argument("--top", type=int, default=12, help="longest kernels listed per side")
    parser.add_argument("--summarize", nargs="+", metavar="CSV",
                        help="only print the tables of saved kernel traces or ncu CSVs")
    args = parser.parse_args()
    if args.summarize:
        sides = []
        for path in args.summarize:
            sides.append((os.path.basename(path), *read_side(path)))
        print_tables(sides, args.top)
        return
    if not args.kiln:
        parser.error("--kiln BINARY is required unless --summarize is given")
    cnn = args.model in ("resnet9", "cnn")
    if args.channels_last and not cnn:
        parser.error("--channels-last is for --model resnet9 or cnn")
    batch_size = args.batch_size or {"resnet9": 512, "cnn": 64}.get(args.model, 16)
    common = ["--model", args.model, "--batch-size", str(batch_size), "--precision", args.precision,
              "--accelerator", "gpu", "--profile-step"]
    if cnn:  # the cuDNN benchmark search and the optimizer state settle in the warm-up
        common += ["--warmup-steps", "3", "--limit-train-batches", "5", "--epochs", "1"]
        common += ["--channels-last"] if args.channels_last else []
    else:
        common += ["--warmup-steps", "2", "--steps", "1"]
    here = os.path.dirname(os.path.abspath(__file__))
    torch_script = os.path.join(here, "torch_fashion.py" if cnn else "torch_transformer.py")
    os.makedirs(args.out_dir, exist_ok=True)
    library = args.trace_lib or os.path.join(os.path.dirname(os.path.abspath(args.kiln)), "libkiln_kernel_trace.so")
    sides = []
    for label, command in (("kiln", [args.kiln] + common), ("torch", [args.python, torch_script] + common)):
        path = os.path.join(args.out_dir, f"{label}_{args.model}{'' if args.tracer == 'cupti' else '_ncu'}.csv")
        if args.tracer == "cupti":
            sides.append((label, *trace(label, command, library, path)))
        else:
            sides.append((label, *profile(label, command, args.ncu, path)))
    layout = ", channels-last" if args.channels_last else ""
    what = "iteration (batch, copy and step)" if cnn else "step"
    how = "CUPTI activity trace, kernels concurrent" if args.tracer == "cupti" else "ncu, kernels serialized"
    print(f"### One {args.model} training {what}, batch {batch_size}, {args.precision}{layout}: kernel time by "
          f"family ({how})\n")
    print_tables(sides, args.top)


if __name__ == "__main__":
    main()
