#!/usr/bin/env python3
"""Where one GPU training step spends its time, kernel by kernel, kiln against PyTorch.

Runs bench_transformer (kiln) and torch_transformer.py (PyTorch) for the
transformers (--model gpt2-124m, gpt, vit), or bench_fashion and
torch_fashion.py for the CNNs (--model resnet9, cnn: one iteration, batch
and copy included), with --profile-step under Nsight Compute (ncu
--profile-from-start off), which times every kernel of the one step
bracketed by cudaProfilerStart/Stop, one
kernel at a time (ncu serializes them: the sum is the GPU's busy time without
overlap; the gap to the wall-clock step of compare_transformers.py is launch
and host overhead). Prints a markdown table by kernel family and the longest
kernels of each side: the list of what to make faster first.

  python3 bench/profile_step.py --kiln build/bin/bench_transformer --python python3
  python3 bench/profile_step.py --model resnet9 --channels-last --kiln build/bin/bench_fashion --python python3
  python3 bench/profile_step.py --summarize kiln.csv [torch.csv]   # tables from saved ncu CSVs
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
    ("copy / cast / fill", r"copy|cast|convert|fill|memset|to_|contiguous"),
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


def summarize(kernels):
    families, names = {}, {}
    for name, us in kernels:
        for table, key in ((families, family_of(name)), (names, name)):
            count, total = table.get(key, (0, 0.0))
            table[key] = (count + 1, total + us)
    return families, names


def print_tables(sides, top):
    """sides: [(label, kernels)]."""
    summaries = [(label, kernels, *summarize(kernels)) for label, kernels in sides]
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
    return parse_ncu_csv(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", help="bench_transformer binary (bench_fashion for --model resnet9 or cnn)")
    parser.add_argument("--python", default=sys.executable, help="the Python with PyTorch")
    parser.add_argument("--ncu", default="ncu")
    parser.add_argument("--model", default="gpt2-124m", choices=["vit", "gpt", "gpt2-124m", "resnet9", "cnn"])
    parser.add_argument("--batch-size", type=int, help="default: 16 (transformers), 512 (resnet9), 64 (cnn)")
    parser.add_argument("--channels-last", action="store_true", help="resnet9/cnn: model and images channels-last")
    parser.add_argument("--precision", default="bf16-mixed", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--out-dir", default=".", help="where the ncu CSV files go")
    parser.add_argument("--top", type=int, default=12, help="longest kernels listed per side")
    parser.add_argument("--summarize", nargs="+", metavar="CSV", help="only print the tables of saved ncu CSVs")
    args = parser.parse_args()
    if args.summarize:
        sides = []
        for path in args.summarize:
            with open(path) as f:
                sides.append((os.path.basename(path), parse_ncu_csv(f.read())))
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
    sides = [("kiln", profile("kiln", [args.kiln] + common, args.ncu,
                              os.path.join(args.out_dir, f"kiln_{args.model}.csv"))),
             ("torch", profile("torch", [args.python, torch_script] + common, args.ncu,
                               os.path.join(args.out_dir, f"torch_{args.model}.csv")))]
    layout = ", channels-last" if args.channels_last else ""
    what = "iteration (batch, copy and step)" if cnn else "step"
    print(f"### One {args.model} training {what}, batch {batch_size}, {args.precision}{layout}: kernel time by "
          f"family (ncu, kernels serialized)\n")
    print_tables(sides, args.top)


if __name__ == "__main__":
    main()
