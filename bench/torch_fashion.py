#!/usr/bin/env python3
"""The PyTorch side of the kiln-vs-PyTorch training comparison (bench/compare_fashion.py).

Trains the same network with the same recipe as bench/bench_fashion.cpp:
FashionCNN (or the ResNet-9-style net) with PyTorch's default initialization,
AdamW (lr 3e-3, weight decay 5e-4) with OneCycle (pct_start 0.25) over the
epochs' steps, batch 128 with drop_last, a fresh shuffle every epoch,
augmentation RandomCrop(28, padding=2) + RandomHorizontalFlip (--augment flip:
the flip only; none or --no-augment: neither) + Normalize (mean/std fitted on
the training images), fp32. --label-smoothing, --pct-start and --tta (the test
logits averaged with the mirror image's) are train_fashion's flags. Prints one
JSON line: samples/s of the training loop (data included, the first warm-up
steps excluded) and the test accuracy after the epochs; --eval-every-epoch
first prints one line per epoch with its test accuracy, as train_fashion
validates on the test split after every epoch (bench/time_to_accuracy.py).
--compile runs the step's model under torch.compile (--compile-mode picks its
mode); --profile-step brackets the first timed iteration with cudaProfilerStart/Stop
(bench/profile_step.py). The JSON line carries train_flops_per_sample (the network's convolution
and linear multiply-adds x 2 x 3) for TFLOP/s and MFU in compare_fashion.py.

The fair CPU peer (issue 9): Debian's python3-torch with OpenBLAS
(libopenblas0-pthread), OPENBLAS_NUM_THREADS=1 and 2 torch threads; the harness
sets both. Data loading runs in this process, vectorized per batch: on two
cores worker processes would only take cores from the step.
"""
import argparse
import gzip
import json
import os
import re
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(root, train):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"))
    images = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return images, torch.from_numpy(labels.astype(np.int64))


def fashion_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def conv_bn_relu(cin, cout, pool):
    layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + x)


def resnet9():
    return nn.Sequential(
        conv_bn_relu(1, 64, False), conv_bn_relu(64, 128, True), BasicBlock(128),
        conv_bn_relu(128, 256, True), conv_bn_relu(256, 512, True), BasicBlock(512),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))


def training_flops_per_sample(model, device):
    """Multiply-adds of the convolutions and linear layers, counted with forward
    hooks on one image, times 2 (FLOPs) and times 3 for a training step (the
    backward's input and weight gradients cost a forward each: the usual MFU count)."""
    flops = 0

    def count(module, inputs, output):
        nonlocal flops
        if isinstance(module, nn.Conv2d):
            per_output = (module.in_channels // module.groups) * module.kernel_size[0] * module.kernel_size[1]
            flops += 2 * output.numel() * per_output
        elif isinstance(module, nn.Linear):
            flops += 2 * output.numel() * module.in_features

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 1, 28, 28, device=device))
    model.train(was_training)
    for hook in hooks:
        hook.remove()
    return 3 * flops


def augment(images, generator, mean, std, mode, padding=2):
    """RandomCrop(28, padding) with zero fill (mode crop+flip), horizontal flip with p=0.5, Normalize."""
    n, _, h, w = images.shape
    device = images.device
    cropped = images
    if mode == "crop+flip":
        padded = F.pad(images, (padding, padding, padding, padding))
        oy = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(device)
        ox = torch.randint(0, 2 * padding + 1, (n,), generator=generator).to(device)
        rows = (oy[:, None] + torch.arange(h, device=device))[:, :, None]
        cols = (ox[:, None] + torch.arange(w, device=device))[:, None, :]
        cropped = padded[torch.arange(n, device=device)[:, None, None], 0, rows, cols].unsqueeze(1)
    flip = (torch.rand(n, generator=generator) < 0.5).to(device)
    cropped = torch.where(flip[:, None, None, None], cropped.flip(3), cropped)
    return (cropped - mean) / std


def blas_backend():
    """The BLAS behind torch's CPU matmuls: the build's own (mkl), or for Debian's
    generic build the folder of the libblas.so.3 the alternatives resolved to
    (openblas-pthread is issue 9's fair peer; blas, the reference one, is not)."""
    build = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    if build and build.group(1) != "generic":
        return build.group(1)
    torch.ones(2, 2) @ torch.ones(2, 2)  # makes sure the library is loaded
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libblas.so"):
                return os.path.basename(os.path.dirname(os.path.realpath(path)))
    return "unknown"


def cuda_grad_scaler(enabled):
    """torch.amp.GradScaler("cuda") where it exists (2.3+, where torch.cuda.amp's is deprecated); 1.13 has only that."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=["cnn", "resnet9"])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--limit-train-batches", type=int, default=0, help="0: the whole epoch")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--precision", default="32-true", choices=["32-true", "16-mixed", "bf16-mixed"],
                        help="mixed: torch.autocast (+ GradScaler for 16-mixed)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--channels-last", action="store_true",
                        help="model and images in torch.channels_last memory format")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark = True (cuDNN autotuning)")
    parser.add_argument("--compile-mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                        help="torch.compile's mode (reduce-overhead: CUDA graphs of the compiled forward and backward)")
    parser.add_argument("--augment", default="crop+flip", choices=["crop+flip", "flip", "none"],
                        help="before Normalize: RandomCrop(28, padding=2) + RandomHorizontalFlip, the flip, or none")
    parser.add_argument("--no-augment", dest="augment", action="store_const", const="none")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--pct-start", type=float, default=0.25, help="OneCycle's share of warm-up steps")
    parser.add_argument("--tta", action="store_true", help="test logits averaged with the mirror image's")
    parser.add_argument("--profile-step", action="store_true",
                        help="the first iteration after the warm-up between cudaProfilerStart and cudaProfilerStop "
                        "(for ncu --profile-from-start off: bench/profile_step.py)")
    parser.add_argument("--eval-every-epoch", action="store_true",
                        help="test after every epoch, one JSON line each (as train_fashion validates)")
    args = parser.parse_args()
    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    amp_dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(args.precision)

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_x, train_y = load_split(args.data_dir, True)
    test_x, test_y = load_split(args.data_dir, False)
    mean, std = train_x.mean().item(), train_x.std(unbiased=False).item()

    model = (fashion_cnn() if args.model == "cnn" else resnet9()).to(device)
    train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
    flops_per_sample = training_flops_per_sample(model, device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    step_model = torch.compile(model, mode=args.compile_mode) if args.compile else model
    scaler = cuda_grad_scaler(enabled=args.precision == "16-mixed")
    batches = len(train_x) // args.batch_size
    if args.limit_train_batches > 0:
        batches = min(batches, args.limit_train_batches)
    if args.profile_step and (device.type != "cuda" or args.warmup_steps >= batches):
        parser.error("--profile-step brackets GPU work after the warm-up: give --accelerator gpu and "
                     f"--warmup-steps below the epoch's {batches} batches")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=batches * args.epochs,
                                                   pct_start=args.pct_start)

    def test_accuracy():
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(test_x), 1000):
                inputs = ((test_x[i:i + 1000] - mean) / std).contiguous(memory_format=memory_format)
                logits = model(inputs)
                if args.tta:
                    logits = (logits + model(inputs.flip(3))) * 0.5
                correct += (logits.argmax(1) == test_y[i:i + 1000]).sum().item()
        model.train()
        return correct / len(test_x)

    timed_samples, timed_seconds = 0, 0.0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train_x), generator=generator)
        start = None
        for step in range(batches):
            if (epoch == 0 and step == args.warmup_steps) or (epoch > 0 and step == 0):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            profiled = args.profile_step and epoch == 0 and step == args.warmup_steps
            if profiled:
                torch.cuda.cudart().cudaProfilerStart()  # the device is idle: synchronized just above
            index = order[step * args.batch_size:(step + 1) * args.batch_size].to(device)
            inputs = (augment(train_x[index], generator, mean, std, args.augment) if args.augment != "none"
                      else (train_x[index] - mean) / std).contiguous(memory_format=memory_format)
            with torch.autocast(device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                loss = F.cross_entropy(step_model(inputs), train_y[index], label_smoothing=args.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            schedule.step()
            if start is not None:
                timed_samples += args.batch_size
            if profiled:
                torch.cuda.synchronize()
                torch.cuda.cudart().cudaProfilerStop()
        if start is not None:
            if device.type == "cuda":
                torch.cuda.synchronize()
            timed_seconds += time.perf_counter() - start
        if args.eval_every_epoch:
            print(json.dumps({"epoch": epoch, "test_acc": test_accuracy()}), flush=True)

    test_acc = test_accuracy()
    print(json.dumps({
        "framework": f"pytorch {torch.__version__}", "model": args.model, "batch_size": args.batch_size,
        "epochs": args.epochs, "steps": batches * args.epochs,
        "samples_per_s": timed_samples / max(timed_seconds, 1e-9),
        "test_acc": test_acc, "final_loss": loss.item(),
        "threads": torch.get_num_threads(), "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "blas": blas_backend(),
        "device": str(device), "precision": args.precision, "compile": args.compile, "channels_last": args.channels_last,
        "cudnn_benchmark": args.cudnn_benchmark,
        "compile_mode": args.compile_mode if args.compile else None, "augment": args.augment,
        "train_flops_per_sample": flops_per_sample,
        "label_smoothing": args.label_smoothing, "pct_start": args.pct_start, "tta": args.tta}))


if __name__ == "__main__":
    main()
