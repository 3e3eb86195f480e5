#!/usr/bin/env python3
"""Trains the same model with the same recipe in kiln and in PyTorch, one after
the other in one run, and prints a Markdown table for bench/RESULTS.md.

    /usr/bin/python3 bench/compare_fashion.py                       # FashionCNN, 1 epoch, CPU
    /usr/bin/python3 bench/compare_fashion.py --model resnet9 --limit-train-batches 40

kiln side: build/bin/bench_fashion; PyTorch side: bench/torch_fashion.py, run
with the fair CPU setting of issue 9 (OpenBLAS, OPENBLAS_NUM_THREADS=1, 2 torch
threads). --rounds N alternates the two N times and reports the median, so a
change of machine load hits both sides alike; round i uses seed 42 + i on both
sides (one-epoch accuracy moves by a few tenths of a point with the seed, so
the table gives the mean over the rounds and its range).
"""
import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys

from peer_runs import PeerRuns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


RUNS = PeerRuns("compare_fashion", ROOT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "resnet9"])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--limit-train-batches", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--torch-compile", action="store_true",
                        help="also run the PyTorch model under torch.compile (a third row)")
    parser.add_argument("--torch-compile-mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                        help="torch.compile's mode for the --torch-compile row (issue 22: reduce-overhead for "
                             "FashionCNN, max-autotune for ResNet-9)")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's dense peak for MFU (H100/H200 SXM bf16/fp16: 989); 0: 989 on a GPU, "
                             "no MFU column on the CPU")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="GPU: also time kiln with the step replayed as one CUDA graph (bench_fashion "
                             "--cuda-graph); the speed-ups are then the graph's")
    parser.add_argument("--cudnn-api", choices=["legacy", "graph"],
                        help="GPU: also time kiln with its convolutions through this cuDNN API "
                             "(KILN_CUDNN_API; kiln's default is the graph API for 16-bit, the legacy API for "
                             "float32); a row of its own")
    parser.add_argument("--channels-last", action="store_true",
                        help="both sides in channels-last (NHWC) memory: torch.channels_last model and images, "
                             "kiln channels-last images (its convolutions then run NHWC on a GPU)")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="GPU: cuDNN autotuning on both sides (kiln set_cudnn_benchmark, "
                             "torch.backends.cudnn.benchmark = True)")
    parser.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True,
                        help="random crop + flip on both sides (--no-augment: normalization only)")
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "bench_fashion"))
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    args = parser.parse_args()

    common = ["--model", args.model, "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
              "--limit-train-batches", str(args.limit_train_batches), "--accelerator", args.accelerator,
              "--precision", args.precision] + ([] if args.augment else ["--no-augment"]) + (
                  ["--channels-last"] if args.channels_last else []) + (
                  ["--cudnn-benchmark"] if args.cudnn_benchmark else [])
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="2")
    # PyTorch eager, and with --torch-compile the same under torch.compile.
    compile_name = "torch.compile" + ("" if args.torch_compile_mode == "default" else f"({args.torch_compile_mode})")
    peers = {"eager": []} | ({compile_name: ["--compile", "--compile-mode", args.torch_compile_mode]}
                             if args.torch_compile else {})
    kiln_runs, graph_runs, cudnn_api_runs, peer_runs = [], [], [], {name: [] for name in peers}
    for round_index in range(args.rounds):
        seeded = common + ["--seed", str(42 + round_index)]
        kiln_runs.append(RUNS.run([args.kiln] + seeded, env))
        if args.cuda_graph:
            graph_run = RUNS.run([args.kiln, "--cuda-graph"] + seeded, env, required=False)
            if graph_run is not None:
                graph_runs.append(graph_run)
        if args.cudnn_api:
            cudnn_run = RUNS.run([args.kiln] + seeded, dict(env, KILN_CUDNN_API=args.cudnn_api), required=False)
            if cudnn_run is not None:
                cudnn_api_runs.append(cudnn_run)
        for name, flags in peers.items():
            peer_run = RUNS.run([args.python, os.path.join(ROOT, "bench", "torch_fashion.py"), "--threads", "2"]
                                + seeded + flags, env, required=name == "eager")
            if peer_run is not None:
                peer_runs[name].append(peer_run)
    peer_runs = {name: runs for name, runs in peer_runs.items() if runs}
    kiln_rate = statistics.median(r["samples_per_s"] for r in kiln_runs)
    # KILN_COMMIT: where the tree travelled without .git (scripts/gpu_kit.sh sets it).
    commit = os.environ.get("KILN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    print(f"{datetime.date.today()} · {platform.node()} · {os.cpu_count()} cores · commit {commit} · "
          f"load {os.getloadavg()[0]:.1f} · {' '.join(sys.argv)}")
    print(f"model {args.model}, batch {args.batch_size}, {args.epochs} epoch(s), "
          f"{kiln_runs[0]['steps']} steps, {args.accelerator}, {args.precision}"
          f"{', ' + compile_name if args.torch_compile else ''}{'' if args.augment else ', no augmentation'}, "
          f"{', channels-last' if args.channels_last else ''}"
          f"{', cuDNN benchmark mode' if args.cudnn_benchmark else ''}, {args.rounds} round(s)\n")
    # Model FLOPs per training sample (torch_fashion.py counts the same network's
    # convolution and linear multiply-adds, x2 x3), for TFLOP/s and MFU on a GPU.
    flops = next(iter(peer_runs.values()))[0].get("train_flops_per_sample", 0)
    peak = args.peak_tflops or (989.0 if args.accelerator == "gpu" else 0.0)

    def throughput(rate):
        if not peak or not flops:
            return ""
        tflops = rate * flops / 1e12
        return f" {tflops:.1f} | {100 * tflops / peak:.1f}% |"
    def accuracy(runs):
        values = [r["test_acc"] * 100 for r in runs]
        return f"{statistics.mean(values):.2f}% ({min(values):.2f}–{max(values):.2f})"

    if peak and flops:
        print(f"model FLOPs per training sample: {flops / 1e6:.1f} M (forward multiply-adds x 2 x 3); "
              f"MFU against {peak:g} TFLOP/s\n")
        print("| framework | samples/s (median) | kiln's speed-up over it | test acc, mean (range) | TFLOP/s | MFU |")
        print("|---|---|---|---|---|---|")
    else:
        print("| framework | samples/s (median) | kiln's speed-up over it | test acc, mean (range) |")
        print("|---|---|---|---|")
    if graph_runs:
        graph_rate = statistics.median(r["samples_per_s"] for r in graph_runs)
        print(f"| kiln, CUDA graph | {graph_rate:,.0f} | — | {accuracy(graph_runs)} |{throughput(graph_rate)}")
        print(f"| kiln eager | {kiln_rate:,.0f} | {graph_rate / kiln_rate:.2f}x | {accuracy(kiln_runs)} |"
              f"{throughput(kiln_rate)}")
        kiln_rate = graph_rate  # the peers' speed-ups below are the graph's
    else:
        print(f"| kiln | {kiln_rate:,.0f} | — | {accuracy(kiln_runs)} |{throughput(kiln_rate)}")
    if cudnn_api_runs:  # its speed-up column: over kiln with its default API choice (the row above)
        rate = statistics.median(r["samples_per_s"] for r in cudnn_api_runs)
        print(f"| kiln, cuDNN {args.cudnn_api} API (speed-up: over the row above) | {rate:,.0f} | "
              f"{rate / kiln_rate:.2f}x | {accuracy(cudnn_api_runs)} |{throughput(rate)}")
    for name, runs in peer_runs.items():
        rate = statistics.median(r["samples_per_s"] for r in runs)
        setting = (f"{runs[0]['blas']} BLAS, OPENBLAS_NUM_THREADS=1, 2 torch threads" if args.accelerator == "cpu"
                   else "CUDA" + (f", {args.precision}" if args.precision != "32-true" else ""))
        print(f"| {runs[0]['framework']} {name} ({setting}) | {rate:,.0f} | {kiln_rate / rate:.2f}x | "
              f"{accuracy(runs)} |{throughput(rate)}")
    RUNS.finish()
    if args.accelerator == "cpu" and any(runs[0]["blas"] == "blas" for runs in peer_runs.values()):
        print("\nWARNING: torch ran on the reference BLAS (several times slower than OpenBLAS): not a fair peer; "
              "install libopenblas0-pthread (issue 9).")

if __name__ == "__main__":
    main()
