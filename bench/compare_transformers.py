#!/usr/bin/env python3
"""Times the same transformer training step in kiln (build/bin/bench_transformer)
and PyTorch (bench/torch_transformer.py), alternating them --rounds times so a
change of machine load hits both, and prints a Markdown table for
bench/RESULTS.md (medians over the rounds).

    /usr/bin/python3 bench/compare_transformers.py --model vit
    /usr/bin/python3 bench/compare_transformers.py --model gpt --rounds 3
    python3 bench/compare_transformers.py --model gpt2-124m --accelerator gpu --precision bf16-mixed --torch-compile \
        --cuda-graph --wgmma-attention 8,12

CPU: Debian's python3-torch with OPENBLAS_NUM_THREADS=1 and 2 torch threads
(the fair setting of bench/compare_fashion.py); kiln with its 2 OpenMP threads.
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


RUNS = PeerRuns("compare_transformers", ROOT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit", choices=["vit", "gpt", "gpt2-124m"])
    parser.add_argument("--batch-size", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile (a third row)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="also time kiln with the step captured as one CUDA graph (GPU; a row of its own)")
    parser.add_argument("--wgmma-attention", default="", metavar="SHAPE[,SHAPE...]",
                        help="also time kiln with its attention on Hopper's wgmma (GPU): forward CTA shape SHAPE "
                             "(7-13, KILN_ATTENTION_FORWARD_SHAPE) and the wgmma backward, a row per shape; each "
                             "such run ends after --optional-timeout seconds (a kernel that hangs costs no more)")
    parser.add_argument("--optional-timeout", type=float, default=60.0,
                        help="seconds each kiln run with wgmma attention may take")
    parser.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's dense peak for MFU (H100/H200 SXM bf16: 989); 0: 989 on a GPU, none on the CPU")
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "bench_transformer"))
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    args = parser.parse_args()
    try:
        wgmma_shapes = [int(shape) for shape in args.wgmma_attention.split(",") if shape.strip()]
    except ValueError:
        parser.error(f"--wgmma-attention: '{args.wgmma_attention}' is not a comma-separated list of shape numbers")
    common = ["--model", args.model, "--batch-size", str(args.batch_size), "--steps", str(args.steps),
              "--accelerator", args.accelerator, "--precision", args.precision]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="2")
    peers = {"torch": []} | ({"torch.compile": ["--compile"]} if args.torch_compile else {})
    kiln_runs, graph_runs, peer_runs = [], [], {name: [] for name in peers}
    wgmma_runs = {shape: [] for shape in wgmma_shapes}
    for round_index in range(args.rounds):
        seeded = common + ["--seed", str(42 + round_index)]
        kiln_runs.append(RUNS.run([args.kiln] + seeded, env))
        if args.cuda_graph:
            graph_run = RUNS.run([args.kiln] + seeded + ["--cuda-graph"], env, required=False)
            if graph_run is not None:
                graph_runs.append(graph_run)
        for shape in wgmma_shapes:
            wgmma_env = dict(env, KILN_ATTENTION_FORWARD_SHAPE=str(shape), KILN_ATTENTION_WGMMA_BACKWARD="1")
            wgmma_run = RUNS.run([args.kiln] + seeded, wgmma_env, required=False, timeout=args.optional_timeout)
            if wgmma_run is not None:
                wgmma_runs[shape].append(wgmma_run)
        for name, flags in peers.items():
            peer_run = RUNS.run([args.python, os.path.join(ROOT, "bench", "torch_transformer.py"), "--threads", "2"]
                                + seeded + flags, env, required=name == "torch")
            if peer_run is not None:
                peer_runs[name].append(peer_run)
    peer_runs = {name: runs for name, runs in peer_runs.items() if runs}
    commit = os.environ.get("KILN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    first = kiln_runs[0]
    print(f"{datetime.date.today()} · {platform.node()} · {os.cpu_count()} cores · commit {commit} · "
          f"load {os.getloadavg()[0]:.1f} · {' '.join(sys.argv)}")
    print(f"model {args.model} ({first['parameters']:,} parameters), batch {first['batch_size']}, {args.steps} steps, "
          f"{args.accelerator}, {args.precision}, {args.rounds} round(s); torch {peer_runs['torch'][0]['torch']}\n")
    peak = args.peak_tflops or (989.0 if args.accelerator == "gpu" else 0.0)

    def mfu(runs):
        return f"{100 * statistics.median(r['model_tflops'] for r in runs) / peak:.1f}%" if peak else "—"

    kiln_ms = statistics.median(r["ms_per_step"] for r in kiln_runs)
    print("| framework | ms/step (median) | tokens/s | model TFLOP/s | MFU | kiln's speed-up over it |")
    print("|---|---|---|---|---|---|")
    print(f"| kiln | {kiln_ms:.1f} | {statistics.median(r['tokens_per_s'] for r in kiln_runs):,.0f} | "
          f"{statistics.median(r['model_tflops'] for r in kiln_runs):.3f} | {mfu(kiln_runs)} | — |")
    if graph_runs:
        ms = statistics.median(r["ms_per_step"] for r in graph_runs)
        print(f"| kiln, one CUDA graph | {ms:.1f} | {statistics.median(r['tokens_per_s'] for r in graph_runs):,.0f} | "
              f"{statistics.median(r['model_tflops'] for r in graph_runs):.3f} | {mfu(graph_runs)} | "
              f"{ms / kiln_ms:.2f}x (kiln eager over it) |")
    elif args.cuda_graph:
        print("| kiln, one CUDA graph | failed (see the run's stderr above) | | | | |")
    for shape, runs in wgmma_runs.items():
        if not runs:
            print(f"| kiln, attention on wgmma (shape {shape}) | failed (see the run's stderr above) | | | | |")
            continue
        ms = statistics.median(r["ms_per_step"] for r in runs)
        print(f"| kiln, attention on wgmma (shape {shape}) | {ms:.1f} | "
              f"{statistics.median(r['tokens_per_s'] for r in runs):,.0f} | "
              f"{statistics.median(r['model_tflops'] for r in runs):.3f} | {mfu(runs)} | "
              f"{ms / kiln_ms:.2f}x (kiln over it) |")
    for name, runs in peer_runs.items():
        ms = statistics.median(r["ms_per_step"] for r in runs)
        print(f"| {name} | {ms:.1f} | {statistics.median(r['tokens_per_s'] for r in runs):,.0f} | "
              f"{statistics.median(r['model_tflops'] for r in runs):.3f} | {mfu(runs)} | {ms / kiln_ms:.2f}x |")
    RUNS.finish()


if __name__ == "__main__":
    main()
