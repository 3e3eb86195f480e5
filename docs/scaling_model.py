#!/usr/bin/env python3
"""Step-time model of data-parallel training for kiln (docs/SCALING.md).

Python 3 standard library only. Every table in docs/SCALING.md is printed by
this script from the inputs below; change an input and re-run:

    python3 docs/scaling_model.py                  # all tables
    python3 docs/scaling_model.py --only comm      # one section: counts comm weak strong buckets memory cpu
    python3 docs/scaling_model.py --gloo-log FILE  # refit the CPU section to a bench_distributed output

Sources of the inputs are named next to them: [P] published (URL in
SCALING.md), [M] measured on the kiln VM, [A] assumption.
"""
import argparse
import math
import re

# ----------------------------------------------------------------- inputs
H100 = dict(
    peak_bf16=989e12,      # [P] dense BF16 tensor FLOP/s, H100 SXM (1,979 is the 2:4-sparse figure)
    hbm_bytes=80e9,        # [P] 80 GB HBM3
    usable_bytes=76e9,     # [A] minus CUDA context, NCCL buffers, allocator slack (~4 GB)
    hbm_bw=3.35e12,        # [P] HBM3 bandwidth
    hbm_eff=0.8,           # [A] fraction of HBM bandwidth a fused AdamW reaches
)
NET = dict(
    gpus_per_node=8,       # [P] DGX H100
    busbw_nvlink=450e9,    # [P] nccl-tests all_reduce busbw, 8x H100 in one node (NVLS): ~450-480 GB/s
    busbw_ib=350e9,        # [P] all_reduce busbw across nodes, 8x 400 Gb/s rails per node: ~350-370 GB/s
    busbw_ib_pessimistic=46e9,  # [P] one 400 Gb/s NIC's worth (46-48 GB/s): a node with a single NIC
    # NCCL 2.20 tuning model (src/graph/tuning.cc), microseconds:
    ring_base=8.4, ring_nvlink_step=3.4, ring_net_step=14.0, ring_plateau=1.4,   # Ring / Simple
    tree_base=14.0, tree_nvlink_hop=1.25, tree_net_hop=8.5,                      # Tree / LL128
    tree_eff=0.92 * 120 / 128,  # tree busBw refinement x LL128 payload efficiency
)
RUN = dict(
    bucket_cap_mib=25,     # kiln DDPOptions::bucket_cap_mb (torch's default too)
    adamw_bytes_per_param=28,  # [A] fused AdamW traffic: grad + fp32 master r/w + m r/w + v r/w + bf16 copy
    overlap_slowdown=0.0,  # [A] slowdown of backward kernels while NCCL runs beside them (not modelled)
)
GPT2 = dict(L=12, d=768, heads=12, T=1024, V=50257,
            tokens_per_gpu=64 * 1024,   # [P] llm.c's 124M run: -b 64 -t 1024 per GPU
            global_tokens=524288,       # [P] llm.c's 124M run: 0.5M-token batch
            mfu=0.415,                  # [P->A] calibrated: the model's 8-GPU step = llm.c's measured 139 ms on 8x H100
            grad_bytes=2)               # bf16 gradients all-reduced (fp32: 4, second column)
RESNET9 = dict(batch_per_gpu=512,       # [P] Myrtle's ResNet-9 batch (one GPU)
               global_batch=512,        # strong scaling
               mfu=0.25,                # [A] ~28% of V100 peak in Myrtle's 79 s run; small convs + BN
               fixed_ms=0.5,            # [A] per-step launch floor (~100 kernels x ~5 us); CUDA graphs cut it
               grad_bytes=4)            # kiln bf16-mixed keeps fp32 parameters -> fp32 gradients
NS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]

# [M] measured here, docs/SCALING.md section 6 (replaced by --gloo-log)
# build/bin/bench_distributed --nproc 2 --max-mb 64, ten runs, 2026-11-26 09:46:39-09:46:54 UTC,
# commit 6ffcf4e, machine otherwise idle (load average 1.35 -> 1.73 from the bench itself)
GLOO_MEASURED = {  # MiB -> median over the ten runs of each run's median time (ms)
    1: 0.676, 2: 2.620, 4: 2.810, 8: 6.241, 16: 11.630, 32: 21.215, 64: 42.056,
}
GLOO_BEST = {  # MiB -> fastest of the ten runs (ms)
    1: 0.415, 2: 0.920, 4: 1.764, 8: 3.749, 16: 7.155, 32: 15.165, 64: 29.962,
}
# [M] small-message latency, 2 ranks, Gloo TCP loopback: a 30-line probe (all_reduce / broadcast of
# 256 B - 4 MiB, barrier before each, median of 41), three runs, 2026-11-26 09:48:50 UTC, idle
GLOO_SMALL = dict(allreduce_ms=0.23, broadcast_ms=0.07)  # medians over 256 B - 64 KiB
FASHIONCNN_CPU = [  # [M] (label, 1 rank DDP ms/step, 2 ranks DDP ms/step), OMP_NUM_THREADS=1, --num-workers 1
    ("bench/RESULTS.md, commit ab27222, load ~1", 59.9, 72.5),
    ("re-run 2026-11-26 09:49 UTC, commit 6ffcf4e, idle (load 1.1-1.2)", 1e3 / 27.95, 1e3 / 23.4),
]


# ----------------------------------------------------------------- models
class Op:
    """One forward op: its parameters (name, numel) and FLOPs per sample (or token)."""

    def __init__(self, name, params, fwd, bwd):
        self.name, self.params, self.fwd, self.bwd = name, params, fwd, bwd


def resnet9(in_ch=1, hw=28, classes=10):
    """kiln's nn::ResNet9 (nn/models.cpp): convs have no bias, BN has weight+bias."""
    ops, s = [], hw

    def conv(name, cin, cout, size, first=False):
        macs = size * size * cin * cout * 9
        # backward: weight gradient (1x) + input gradient (1x), none for the input image
        ops.append(Op(name, [(name + ".weight", cout * cin * 9)], 2 * macs, (2 if first else 4) * macs))

    def bn(name, c):
        ops.append(Op(name, [(name + ".weight", c), (name + ".bias", c)], 0, 0))

    conv("prep.0", in_ch, 64, s, first=True); bn("prep.1", 64)
    conv("layer1.0", 64, 128, s); bn("layer1.1", 128); s //= 2
    for i in (1, 2):
        conv(f"residual1.0.conv{i}", 128, 128, s); bn(f"residual1.0.bn{i}", 128)
    conv("layer2.0", 128, 256, s); bn("layer2.1", 256); s //= 2
    conv("layer3.0", 256, 512, s); bn("layer3.1", 512); s //= 2
    for i in (1, 2):
        conv(f"residual3.0.conv{i}", 512, 512, s); bn(f"residual3.0.bn{i}", 512)
    ops.append(Op("head.2", [("head.2.weight", 512 * classes), ("head.2.bias", classes)],
                  2 * 512 * classes, 4 * 512 * classes))
    buffers = 2 * (64 + 128 * 3 + 256 + 512 * 3) + 8  # BN running mean/var (+ counters)
    return ops, buffers


def gpt2(L, d, T, V, **_):
    """GPT-2 124M, nanoGPT/llm.c layout, per token. wte is tied to the head, so its
    gradient is complete only after the embedding's backward (the last op)."""
    ops = [Op("embed", [("wte", V * d), ("wpe", T * d)], 0, 0)]
    for l in range(L):
        p = f"h.{l}."
        ln = lambda n: Op(p + n, [(p + n + ".weight", d), (p + n + ".bias", d)], 0, 0)
        lin = lambda n, i, o: Op(p + n, [(p + n + ".weight", i * o), (p + n + ".bias", o)], 2 * i * o, 4 * i * o)
        ops += [ln("ln_1"), lin("attn.c_attn", d, 3 * d),
                Op(p + "attn.core", [], 4 * T * d, 8 * T * d),  # QK^T and AV: 12*T*d fwd+bwd per layer
                lin("attn.c_proj", d, d), ln("ln_2"), lin("mlp.c_fc", d, 4 * d), lin("mlp.c_proj", 4 * d, d)]
    ops += [Op("ln_f", [("ln_f.weight", d), ("ln_f.bias", d)], 0, 0),
            Op("lm_head", [], 2 * d * V, 4 * d * V)]  # tied: no parameter of its own
    return ops, 0


def n_params(ops):
    return sum(n for op in ops for _, n in op.params)


def buckets(ops, grad_bytes, cap_bytes):
    """kiln nn/ddp.cpp build_buckets: reverse registration order, a new bucket
    when adding a parameter would exceed the cap. Returns lists of param names."""
    params = [p for op in ops for p in op.params]
    out, cur, size = [], [], 0
    for name, n in reversed(params):
        if cur and size + n * grad_bytes > cap_bytes:
            out.append(cur); cur, size = [], 0
        cur.append((name, n)); size += n * grad_bytes
    if cur:
        out.append(cur)
    return out


# ----------------------------------------------------------------- communication
def allreduce(S, N, net=NET, busbw_inter=None):
    """Time (s) of an all-reduce of S bytes over N GPUs: min over NCCL's ring
    (Simple) and tree (LL128) of  alpha + S * 2(N-1)/N / (B * eff)."""
    if N <= 1 or S <= 0:
        return 0.0, "-"
    G = net["gpus_per_node"]
    M = max(1, math.ceil(N / G))
    ppn = N // M
    B = net["busbw_nvlink"] if M == 1 else (busbw_inter or net["busbw_ib"])
    wire = S * 2 * (N - 1) / N
    if M == 1:
        a_ring = net["ring_base"] + 2 * (N - 1) * net["ring_nvlink_step"]
    else:
        a_ring = net["ring_plateau"] * (net["ring_base"] + (2 * (N - 1) - 2 * M) * net["ring_nvlink_step"]
                                        + 2 * M * net["ring_net_step"])
    a_tree = net["tree_base"] + 2 * ((ppn - 1) * net["tree_nvlink_hop"] + math.log2(M) * net["tree_net_hop"])
    t_ring = a_ring * 1e-6 + wire / B
    t_tree = a_tree * 1e-6 + wire / (B * net["tree_eff"])
    return (t_ring, "ring") if t_ring <= t_tree else (t_tree, "tree")


def alphas(N, net=NET):
    G = net["gpus_per_node"]
    M = max(1, math.ceil(N / G))
    if M == 1:
        a_ring = net["ring_base"] + 2 * (N - 1) * net["ring_nvlink_step"]
    else:
        a_ring = net["ring_plateau"] * (net["ring_base"] + (2 * (N - 1) - 2 * M) * net["ring_nvlink_step"]
                                        + 2 * M * net["ring_net_step"])
    a_tree = net["tree_base"] + 2 * ((N // M - 1) * net["tree_nvlink_hop"] + math.log2(M) * net["tree_net_hop"])
    return a_ring, a_tree


# ----------------------------------------------------------------- step model
def step(ops, samples, flops_per_sample, mfu, N, grad_bytes, fixed_s=0.0, buffers=0,
         busbw_inter=None, run=RUN, cap_mib=None):
    """One data-parallel step on one GPU of N. Compute time = FLOPs/(peak*MFU) +
    fixed, split over the ops by their FLOPs; a bucket's all-reduce starts when its
    last gradient is produced and the previous bucket's all-reduce is done."""
    peak = H100["peak_bf16"]
    t_comp = samples * flops_per_sample / (peak * mfu) + fixed_s
    fwd = sum(op.fwd for op in ops)
    tot = fwd + sum(op.bwd for op in ops)
    t = t_comp * fwd / tot
    ready = {}
    for op in reversed(ops):
        t += t_comp * op.bwd / tot * (1 + run["overlap_slowdown"] * (N > 1))
        for name, _ in op.params:
            ready[name] = t
    t_compute_end = t
    bks = buckets(ops, grad_bytes, (cap_mib or run["bucket_cap_mib"]) * 2**20)
    end, comm = 0.0, 0.0
    for b in bks:
        S = sum(n for _, n in b) * grad_bytes
        dt, _ = allreduce(S, N, busbw_inter=busbw_inter)
        end = max(end, max(ready[name] for name, _ in b)) + dt
        comm += dt
    pre = allreduce(buffers * 4, N, busbw_inter=busbw_inter)[0] if buffers else 0.0  # buffer broadcast ~ alpha
    t_opt = n_params(ops) * run["adamw_bytes_per_param"] / (H100["hbm_bw"] * H100["hbm_eff"])
    stp = pre + max(t_compute_end, end) + t_opt
    exposed = max(0.0, stp - t_comp - t_opt)
    return dict(compute=t_comp, comm=comm + pre, exposed=exposed, step=stp, opt=t_opt, buckets=len(bks))


# ----------------------------------------------------------------- tables
def ms(x):
    return f"{x * 1e3:,.2f}"


def table(head, rows):
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    print()


def gpt2_flops_per_token(g=GPT2):
    N = n_params(gpt2(**g)[0])
    return 6 * N + 12 * g["L"] * g["T"] * g["d"]


def resnet_flops(ops):
    return sum(op.fwd + op.bwd for op in ops)


def section_counts():
    print("### 1. Workloads\n")
    rows = []
    for label, (ops, _), fl in [
        ("ResNet-9, 1x28x28 (kiln)", resnet9(1, 28), None),
        ("ResNet-9, 3x32x32 (CIFAR-10)", resnet9(3, 32), None),
        ("GPT-2 124M (per token)", gpt2(**GPT2), gpt2_flops_per_token()),
    ]:
        P = n_params(ops)
        fwd = sum(op.fwd for op in ops) if fl is None else fl / 3
        tot = resnet_flops(ops) if fl is None else fl
        nb32 = len(buckets(ops, 4, RUN["bucket_cap_mib"] * 2**20))
        nb16 = len(buckets(ops, 2, RUN["bucket_cap_mib"] * 2**20))
        rows.append([label, f"{P:,}", f"{P * 4 / 1e6:,.1f} / {nb32}", f"{P * 2 / 1e6:,.1f} / {nb16}",
                     f"{fwd / 1e9:,.3f}", f"{tot / 1e9:,.3f}"])
    table(["model", "parameters", "fp32 grads MB / buckets", "bf16 grads MB / buckets",
           "fwd GFLOP", "fwd+bwd GFLOP"], rows)
    g = GPT2
    N = n_params(gpt2(**g)[0])
    print(f"GPT-2: 6N = {6 * N / 1e6:,.1f} MFLOP/token, attention 12*L*T*d = "
          f"{12 * g['L'] * g['T'] * g['d'] / 1e6:,.1f} MFLOP/token; "
          f"wte = {g['V'] * g['d']:,} params ({g['V'] * g['d'] / N:.0%} of N, one bucket on its own).\n")
    print("ResNet-9 (1x28x28) per layer, in backward order:\n")
    ops, _ = resnet9(1, 28)
    tot = resnet_flops(ops)
    rows = []
    for op in reversed(ops):
        if op.fwd == 0:
            continue
        rows.append([op.name, f"{n_params([op]):,}", f"{op.fwd / 2 / 1e6:,.1f}", f"{(op.fwd + op.bwd) / tot:.1%}",
                     f"{n_params([op]) / n_params(ops):.1%}"])
    table(["layer", "params", "MMAC/sample", "share of FLOPs", "share of params"], rows)


def section_comm():
    print("### 3. All-reduce time (NCCL model)\n")
    S25 = RUN["bucket_cap_mib"] * 2**20
    gp = n_params(gpt2(**GPT2)[0]) * 2
    rows = []
    for N in NS[1:]:
        a_r, a_t = alphas(N)
        t25, alg25 = allreduce(S25, N)
        tg, algg = allreduce(gp, N)
        busbw = S25 * 2 * (N - 1) / N / t25 / 1e9
        rows.append([N, max(1, math.ceil(N / 8)), f"{a_r:,.0f}", f"{a_t:,.0f}", f"{t25 * 1e3:.3f} ({alg25})",
                     f"{busbw:,.0f}", f"{tg * 1e3:.2f} ({algg})"])
    table(["N", "nodes", "alpha ring us", "alpha tree us", "25 MiB: ms (alg)", "25 MiB: busbw GB/s",
           "GPT-2 bf16 grads 249 MB: ms"], rows)


def scaling_rows(kind, variant=None):
    out = []
    for N in NS:
        if kind == "gpt2":
            ops, buf = gpt2(**GPT2)
            r = step(ops, GPT2["tokens_per_gpu"], gpt2_flops_per_token(), GPT2["mfu"], N,
                     variant.get("grad_bytes", GPT2["grad_bytes"]) if variant else GPT2["grad_bytes"],
                     busbw_inter=variant.get("ib") if variant else None)
        else:
            ops, buf = resnet9(*kind)
            r = step(ops, RESNET9["batch_per_gpu"], resnet_flops(ops), RESNET9["mfu"], N,
                     variant.get("grad_bytes", RESNET9["grad_bytes"]) if variant else RESNET9["grad_bytes"],
                     fixed_s=RESNET9["fixed_ms"] * 1e-3, buffers=buf,
                     busbw_inter=variant.get("ib") if variant else None)
        out.append(r)
    base = out[0]["step"]
    return [(N, r, base / r["step"]) for N, r in zip(NS, out)]


def section_weak():
    print("### 4a. Weak scaling (fixed per-GPU batch)\n")
    for title, kind, alt in [
        (f"GPT-2 124M, {GPT2['tokens_per_gpu']:,} tokens/GPU, bf16 gradients", "gpt2", {"grad_bytes": 4}),
        (f"ResNet-9 1x28x28, batch {RESNET9['batch_per_gpu']}/GPU, fp32 gradients", (1, 28), {"grad_bytes": 2}),
        (f"ResNet-9 3x32x32, batch {RESNET9['batch_per_gpu']}/GPU, fp32 gradients", (3, 32), {"grad_bytes": 2}),
    ]:
        print(f"**{title}**\n")
        main = scaling_rows(kind)
        other = scaling_rows(kind, alt)
        pess = scaling_rows(kind, {"ib": NET["busbw_ib_pessimistic"]})
        alt_name = "eff, fp32 grads" if alt["grad_bytes"] == 4 else "eff, bf16 grads"
        rows = [[N, ms(r["compute"]), ms(r["comm"]), ms(r["exposed"]), ms(r["step"]), f"{e:.1%}",
                 f"{o[2]:.1%}", f"{p[2]:.1%}"] for (N, r, e), o, p in zip(main, other, pess)]
        table(["N", "compute ms", "all-reduce ms (sum)", "exposed ms", "step ms", "efficiency",
               alt_name, "eff, 46 GB/s IB"], rows)


def section_strong():
    print("### 4b. Strong scaling (fixed global batch)\n")
    for title, kind in [(f"ResNet-9 1x28x28, global batch {RESNET9['global_batch']}", (1, 28)),
                        (f"GPT-2 124M, global batch {GPT2['global_tokens']:,} tokens", "gpt2")]:
        print(f"**{title}**\n")
        rows, base = [], None
        for N in NS:
            if kind == "gpt2":
                per = GPT2["global_tokens"] / N
                if per < GPT2["T"]:  # less than one sequence per GPU
                    break
                ops, buf = gpt2(**GPT2)
                r = step(ops, per, gpt2_flops_per_token(), GPT2["mfu"], N, GPT2["grad_bytes"])
                label = f"{per:,.0f} tok"
            else:
                per = RESNET9["global_batch"] / N
                if per < 1:
                    break
                ops, buf = resnet9(*kind)
                r = step(ops, per, resnet_flops(ops), RESNET9["mfu"], N, RESNET9["grad_bytes"],
                         fixed_s=RESNET9["fixed_ms"] * 1e-3, buffers=buf)
                label = f"{per:g}"
            base = base or r["step"]
            sp = base / r["step"]
            rows.append([N, label, ms(r["compute"]), ms(r["exposed"]), f"{r['exposed'] / r['compute']:.2f}",
                         ms(r["step"]), f"{sp:.1f}x", f"{sp / N:.0%}"])
        table(["N", "per GPU", "compute ms", "exposed ms", "exposed / compute", "step ms", "speed-up",
               "efficiency"], rows)


def section_buckets():
    print("### 4c. Exposed communication (ms) against the bucket cap\n")
    caps = [1, 4, 8, 25, 50, 100]
    cases = []
    for N in (64, 1024):
        ops, buf = resnet9(1, 28)
        for gb in (4, 2):
            cases.append((f"ResNet-9 28x28, b=512, {'fp32' if gb == 4 else 'bf16'} grads, N={N}",
                          lambda c, N=N, gb=gb, ops=ops, buf=buf: step(
                              ops, RESNET9["batch_per_gpu"], resnet_flops(ops), RESNET9["mfu"], N, gb,
                              fixed_s=RESNET9["fixed_ms"] * 1e-3, buffers=buf, cap_mib=c)))
    for N, tok in ((64, GPT2["tokens_per_gpu"]), (1024, GPT2["tokens_per_gpu"]), (256, 2048), (1024, 512)):
        ops, _ = gpt2(**GPT2)
        cases.append((f"GPT-2, {tok:,} tok/GPU, bf16 grads, N={N}",
                      lambda c, N=N, tok=tok, ops=ops: step(ops, tok, gpt2_flops_per_token(), GPT2["mfu"], N,
                                                            GPT2["grad_bytes"], cap_mib=c)))
    rows = []
    for name, f in cases:
        rows.append([name] + [f"{f(c)['exposed'] * 1e3:.2f} ({f(c)['buckets']})" for c in caps])
    table(["case (exposed ms, (buckets))"] + [f"{c} MiB" for c in caps], rows)


def section_memory():
    print("### 5. Memory per GPU (H100 80 GB)\n")
    g = GPT2
    N = n_params(gpt2(**g)[0])
    b = g["tokens_per_gpu"] // g["T"]
    s, h, L, a, V = g["T"], g["d"], g["L"], g["heads"], g["V"]
    act_flash = 34 * s * b * h * L
    act_full = s * b * h * (34 + 5 * a * s / h) * L
    logits = b * s * V * 2
    rows = [["weights bf16 (2 B)", f"{2 * N / 1e9:.2f}"], ["gradients bf16 (2 B)", f"{2 * N / 1e9:.2f}"],
            ["AdamW: fp32 master + m + v (12 B)", f"{12 * N / 1e9:.2f}"],
            [f"activations 34*s*b*h*L, b={b} (flash attention)", f"{act_flash / 1e9:.1f}"],
            [f"  without flash attention: s*b*h*(34+5*a*s/h)*L", f"({act_full / 1e9:.1f})"],
            [f"logits b*s*V bf16", f"{logits / 1e9:.1f}"],
            ["total (flash)", f"{(16 * N + act_flash + logits) / 1e9:.1f}"]]
    per_seq = (act_flash + logits) / b
    per_seq_full = (act_full + logits) / b
    rows.append([f"sequences per GPU that fit in {H100['usable_bytes'] / 1e9:.0f} GB: flash / without",
                 f"{(H100['usable_bytes'] - 16 * N) / per_seq:.0f} / {(H100['usable_bytes'] - 16 * N) / per_seq_full:.0f}"])
    print(f"**GPT-2 124M, {b} x {s} tokens per GPU**\n")
    table(["item", "GB"], rows)
    ops, _ = resnet9(1, 28)
    P = n_params(ops)
    # activations kept for backward: every conv input/output, BN output, pools (fp32, measured 234 MiB at b=128)
    meas = 234.3 * 2**20 / 128
    rows = [["weights + grads + AdamW (fp32 params: 4+4+8 B)", f"{16 * P / 1e9:.2f}"],
            [f"activations, {meas / 1e6:.2f} MB/sample measured x {RESNET9['batch_per_gpu']}",
             f"{meas * RESNET9['batch_per_gpu'] / 1e9:.2f}"]]
    print(f"**ResNet-9 1x28x28, batch {RESNET9['batch_per_gpu']} per GPU**\n")
    table(["item", "GB"], rows)
    budget = 60e9
    print(f"**Largest model whose model states (16 B/param, ZeRO paper) fit in {budget / 1e9:.0f} GB "
          f"(the rest of {H100['usable_bytes'] / 1e9:.0f} GB usable left to activations)**\n")
    rows = []
    for Nn in (8, 64, 1024):
        rows.append([Nn, f"{budget / 16 / 1e9:.2f}", f"{budget / (4 + 12 / Nn) / 1e9:.1f}",
                     f"{budget / (2 + 14 / Nn) / 1e9:.1f}", f"{budget / (16 / Nn) / 1e9:,.0f}"])
    table(["N", "DDP: 16 B", "ZeRO-1: 4+12/N B", "ZeRO-2: 2+14/N B", "ZeRO-3/FSDP: 16/N B"],
          [[r[0]] + [x + "B params" for x in r[1:]] for r in rows])
    t_opt = N * RUN["adamw_bytes_per_param"] / (H100["hbm_bw"] * H100["hbm_eff"])
    rows = []
    for Nn in (8, 64, 1024):
        ag = allreduce(2 * N, Nn)[0] / 2  # all-gather of bf16 params: half an all-reduce's bytes
        rows.append([Nn, f"{12 * N * (1 - 1 / Nn) / 1e9:.2f}", ms(t_opt * (1 - 1 / Nn)), ms(ag)])
    print("**ZeRO-1 for GPT-2 124M: what sharding the optimizer saves and costs per step**\n")
    table(["N", "memory saved GB", "optimizer time saved ms", "all-gather of bf16 params ms (exposed unless "
           "overlapped with the next forward)"], rows)


def fit_gloo(points):
    """Least squares t = a + S/B over the sizes; returns (a seconds, 1/B seconds per byte)."""
    xs = [mb * 2**20 for mb in points]
    ys = [points[mb] * 1e-3 for mb in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def section_cpu(med, best):
    print("### 6. Gloo on this VM and kiln's CPU DDP step\n")
    a, k = fit_gloo(med)
    ab, kb = fit_gloo(best)
    rows = []
    for mb in sorted(med):
        S = mb * 2**20
        rows.append([f"{mb} MiB", f"{med[mb]:.2f}", f"{S / med[mb] / 1e6:.2f}", f"{best[mb]:.2f}",
                     f"{S / best[mb] / 1e6:.2f}"])
    table(["size", "median ms", "busbw GB/s", "best ms", "best busbw GB/s"], rows)
    print(f"Least-squares slope over 1-64 MiB: B = {1 / k / 1e9:.2f} GB/s (medians), {1 / kb / 1e9:.2f} GB/s "
          f"(best runs); the intercepts ({a * 1e3:.2f}, {ab * 1e3:.2f} ms) are within the noise. "
          "With 2 ranks busbw = algbw (2(n-1)/n = 1).\n")
    print(f"Small messages (probe, 256 B - 64 KiB): all_reduce {GLOO_SMALL['allreduce_ms']:.2f} ms, broadcast "
          f"{GLOO_SMALL['broadcast_ms']:.2f} ms per call: the per-bucket overhead.\n")
    P = 421738  # FashionCNN parameters (nn/models.cpp): one fp32 bucket of 1.69 MB
    S = P * 4
    t_ar = GLOO_SMALL["allreduce_ms"] * 1e-3 + k * S
    t_bc = GLOO_SMALL["broadcast_ms"] * 1e-3  # BatchNorm buffers before each forward: 192 floats + 2 counters
    rows = [["all-reduce of the one 1.69 MB bucket = 0.23 ms + S/B (exposed: ready at the end of backward)",
             ms(t_ar)],
            ["BatchNorm buffer broadcast before the forward (~0.8 KB)", ms(t_bc)],
            ["predicted extra per step, 2 ranks vs 1 rank", ms(t_ar + t_bc)]]
    table(["FashionCNN, fp32, batch 128 per rank", "ms"], rows)
    rows = []
    for label, one, two in FASHIONCNN_CPU:
        rows.append([label, f"{one:.1f}", f"{one + (t_ar + t_bc) * 1e3:.1f}", f"{two:.1f}",
                     f"{two - one - (t_ar + t_bc) * 1e3:.1f}"])
    table(["run", "1 rank, DDP, ms/step", "2 ranks predicted", "2 ranks measured", "unexplained ms"], rows)


def parse_gloo_log(path):
    """Gloo rows of one or more bench_distributed outputs -> (median, best) per size."""
    runs = {}
    nccl = False
    with open(path) as fh:
        for line in fh:
            if "NCCL" in line:
                nccl = True
            if "Gloo" in line:
                nccl = False
            m = re.match(r"\s*(\d+) MiB\s+\d+\s+([\d.]+)", line)
            if m and not nccl:
                runs.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    med = {k: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2
           for k, v in runs.items()}
    return med, {k: min(v) for k, v in runs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["counts", "comm", "weak", "strong", "buckets", "memory", "cpu"])
    ap.add_argument("--gloo-log", help="bench_distributed output to refit section 6 (Gloo rows only)")
    args = ap.parse_args()
    med, best = parse_gloo_log(args.gloo_log) if args.gloo_log else (GLOO_MEASURED, GLOO_BEST)
    sections = dict(counts=section_counts, comm=section_comm, weak=section_weak, strong=section_strong,
                    buckets=section_buckets, memory=section_memory, cpu=lambda: section_cpu(med, best))
    for name, fn in sections.items():
        if args.only in (None, name):
            fn()


if __name__ == "__main__":
    main()
