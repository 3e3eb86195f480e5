#!/usr/bin/env python3
"""Time to accuracy on Fashion-MNIST: kiln's main job against PyTorch trained
with the same recipe, in one run, over several seeds. Prints a Markdown table
for bench/RESULTS.md.

    /usr/bin/python3 bench/time_to_accuracy.py                  # the main job's recipe, 5 seeds
    /usr/bin/python3 bench/time_to_accuracy.py --epochs 12 --seeds 2 --targets 92 93
    python3 bench/time_to_accuracy.py --accelerator gpu --model resnet9 --precision bf16-mixed \
        --epochs 10 --seeds 1 --targets 93 94         # issue 22: time to 94% on a GPU

kiln side: build/bin/train_fashion (the main job itself: start-up, data
loading, worker threads, validation on the test split after every epoch,
checkpoints, the final test pass). PyTorch side: bench/torch_fashion.py with
the same model, recipe and schedule, testing after every epoch too, on issue
9's fair CPU setting (Debian's torch with OpenBLAS, OPENBLAS_NUM_THREADS=1, 2
torch threads). The two alternate, seed by seed, so a change of machine load
hits both alike.

Times are wall-clock seconds from the process's launch, as a user sees them:
"time to 92%" is when the first epoch whose test accuracy (test-time flip
included when the recipe has it) reaches 92% finished its evaluation; "wall"
is the whole process. The goal of issue 25 is the slowest seed's wall under
60 s with every seed at 92% or more.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The main job's recipe (examples/train_fashion.cpp's defaults), given to both sides explicitly.
RECIPE = {"batch-size": 128, "lr": 3e-3, "weight-decay": 5e-4, "augment": "flip", "label-smoothing": 0.1,
          "pct-start": 0.25}

KILN_EPOCH = re.compile(r"epoch (\d+) val_acc ([0-9.]+)")
KILN_TEST = re.compile(r"^test_acc ([0-9.]+)")


def timed_run(command, env):
    """Runs command; returns (wall seconds, [(seconds since launch, line)])."""
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in process.stdout]
    if process.wait() != 0:
        sys.exit(f"time_to_accuracy: {' '.join(command)} failed ({process.returncode}):\n"
                 + "\n".join(line for _, line in lines[-30:]))
    return time.perf_counter() - start, lines


def kiln_run(args, seed, env):
    with tempfile.TemporaryDirectory(prefix="kiln_tta_") as root:
        command = [args.kiln, "--seed", str(seed), "--max-epochs", str(args.epochs), "--default-root-dir", root,
                   "--enable-progress-bar", "false"] + device_flags(args)
        command += [f"--{k}={v}" for k, v in RECIPE.items()] + (["--tta"] if args.tta else [])
        wall, lines = timed_run(command, env)
    epochs, final = [], None
    for stamp, line in lines:
        if match := KILN_EPOCH.search(line):
            epochs.append((int(match.group(1)), float(match.group(2)), stamp))
        elif match := KILN_TEST.match(line):
            final = float(match.group(1))
    if final is None or len(epochs) != args.epochs:
        sys.exit(f"time_to_accuracy: kiln printed {len(epochs)} epoch lines (want {args.epochs}) "
                 f"and {'no' if final is None else 'a'} test_acc line:\n" + "\n".join(l for _, l in lines[-30:]))
    return {"wall": wall, "epochs": epochs, "test_acc": final}


def torch_run(args, seed, env):
    command = [args.python, os.path.join(ROOT, "bench", "torch_fashion.py"), "--threads", "2", "--seed", str(seed),
               "--epochs", str(args.epochs), "--eval-every-epoch", "--warmup-steps", "0"] + device_flags(args)
    command += [f"--{k}={v}" for k, v in RECIPE.items()] + (["--tta"] if args.tta else [])
    wall, lines = timed_run(command, env)
    epochs, summary = [], None
    for stamp, line in lines:
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "epoch" in record and "framework" not in record:
            epochs.append((record["epoch"], record["test_acc"], stamp))
        else:
            summary = record
    if summary is None or len(epochs) != args.epochs:
        sys.exit(f"time_to_accuracy: torch_fashion.py printed {len(epochs)} epoch lines (want {args.epochs}):\n"
                 + "\n".join(l for _, l in lines[-30:]))
    return {"wall": wall, "epochs": epochs, "test_acc": summary["test_acc"], "framework": summary["framework"],
            "blas": summary["blas"]}


def device_flags(args):
    """The model, device and precision: the same flags on both sides (train_fashion and torch_fashion.py)."""
    flags = ["--model", args.model, "--accelerator", args.accelerator, "--precision", args.precision]
    return flags + (["--channels-last"] if args.channels_last else [])


def reached(run, target):
    """(epochs, seconds) at the first epoch at or over target (a fraction), or None."""
    for epoch, accuracy, stamp in run["epochs"]:
        if accuracy >= target:
            return epoch + 1, stamp
    return None


def summary_row(name, runs, targets):
    accuracies = [r["test_acc"] * 100 for r in runs]
    walls = [r["wall"] for r in runs]
    cells = [name, f"{statistics.mean(accuracies):.2f}% ({min(accuracies):.2f}–{max(accuracies):.2f})",
             f"{statistics.mean(walls):.1f} (slowest {max(walls):.1f})"]
    for target in targets:
        hits = [reached(r, target / 100) for r in runs]
        got = [h for h in hits if h]
        if not got:
            cells.append("not reached")
            continue
        epochs = sorted({h[0] for h in got})
        cell = (f"{statistics.mean(h[1] for h in got):.1f} s (slowest {max(h[1] for h in got):.1f}), "
                f"epoch {'/'.join(map(str, epochs))}")
        if len(got) < len(runs):
            cell += f"; {len(runs) - len(got)} of {len(runs)} seeds never"
        cells.append(cell)
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4, help="the schedule's length (OneCycle spans it)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N on both sides")
    parser.add_argument("--targets", type=float, nargs="+", default=[92.0, 93.0], help="test accuracies, percent")
    parser.add_argument("--tta", action=argparse.BooleanOptionalAction, default=True,
                        help="test-time flip augmentation on both sides (the main job's default)")
    parser.add_argument("--model", default="cnn", choices=["cnn", "resnet9"])
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "16-mixed"])
    parser.add_argument("--channels-last", action="store_true",
                        help="model and images channels-last on both sides (issue 22's ResNet-9 recipe on a GPU)")
    parser.add_argument("--kiln-only", action="store_true", help="skip PyTorch (the goal's 5-seed check)")
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "bin", "train_fashion"))
    parser.add_argument("--python", default="/usr/bin/python3", help="the Python that has torch")
    args = parser.parse_args()

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
    load_before = os.getloadavg()[0]
    kiln_runs, torch_runs = [], []
    for seed in range(1, args.seeds + 1):
        kiln_runs.append(kiln_run(args, seed, env))
        print(f"seed {seed}: kiln {kiln_runs[-1]['test_acc'] * 100:.2f}% in {kiln_runs[-1]['wall']:.1f} s",
              end="", file=sys.stderr, flush=True)
        if not args.kiln_only:
            torch_runs.append(torch_run(args, seed, env))
            print(f", torch {torch_runs[-1]['test_acc'] * 100:.2f}% in {torch_runs[-1]['wall']:.1f} s",
                  end="", file=sys.stderr)
        print(file=sys.stderr)

    commit = os.environ.get("KILN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    print(f"{datetime.date.today()} · {platform.node()} · {os.cpu_count()} cores · commit {commit} · "
          f"load {load_before:.1f} before, {os.getloadavg()[0]:.1f} after · {' '.join(sys.argv)}")
    recipe = ", ".join(f"{k} {v}" for k, v in RECIPE.items())
    model = {"cnn": "FashionCNN", "resnet9": "ResNet-9"}[args.model]
    print(f"{model}, {args.accelerator}, {args.precision}{', channels-last' if args.channels_last else ''}, "
          f"{args.epochs} epochs, {recipe}"
          f"{', test-time flip' if args.tta else ''}; seeds 1–{args.seeds}\n")
    print("| framework | final test acc, mean (range) | wall s, mean | "
          + " | ".join(f"time to {t:g}%, mean" for t in args.targets) + " |")
    print("|---" * (3 + len(args.targets)) + "|")
    print(summary_row("kiln", kiln_runs, args.targets))
    if torch_runs:
        setting = (f"{torch_runs[0]['blas']} BLAS, OPENBLAS_NUM_THREADS=1, 2 torch threads"
                   if args.accelerator == "cpu" else f"CUDA, {args.precision}")
        print(summary_row(f"{torch_runs[0]['framework']} ({setting})", torch_runs, args.targets))
        print()
        for target in args.targets:  # issue 22 asks for the time to its last target (94%)
            kiln_hits = [reached(r, target / 100) for r in kiln_runs]
            torch_hits = [reached(r, target / 100) for r in torch_runs]
            if all(kiln_hits) and all(torch_hits):
                ratio = statistics.mean(h[1] for h in torch_hits) / statistics.mean(h[1] for h in kiln_hits)
                print(f"kiln reaches {target:g}% **{ratio:.2f}x** sooner than PyTorch (mean over seeds).")
            else:
                print(f"{target:g}%: not reached by every seed of both sides ({sum(map(bool, kiln_hits))} of "
                      f"{len(kiln_runs)} kiln, {sum(map(bool, torch_hits))} of {len(torch_runs)} PyTorch).")
        print(f"Whole runs: kiln {statistics.mean(r['wall'] for r in torch_runs) / statistics.mean(r['wall'] for r in kiln_runs):.2f}x "
              f"PyTorch's speed.")
    slowest = max(r["wall"] for r in kiln_runs)
    worst = min(r["test_acc"] for r in kiln_runs) * 100
    if args.accelerator == "cpu" and args.model == "cnn":
        print(f"\nissue 25's goal (every seed ≥ 92.0%, slowest ≤ 60 s): kiln's worst seed {worst:.2f}%, "
              f"slowest {slowest:.1f} s: {'met' if worst >= 92.0 and slowest <= 60.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
