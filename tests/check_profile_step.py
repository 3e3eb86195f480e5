#!/usr/bin/env python3
"""bench/profile_step.py's CUPTI trace path and the injection library it uses, on a machine without a GPU.

  python3 tests/check_profile_step.py build/bin/libkiln_kernel_trace.so .

What can run here: the trace parser (window, the union of overlapping
intervals that is the GPU's busy time, demangled names shortened, a trace
without a window refused), the tables printed from a trace and from an ncu
CSV, and the library itself: it loads, exports InitializeInjection (what the
CUDA driver calls), and refuses to start without KILN_KERNEL_TRACE. Recording
needs a GPU (the GPU kit's profile step).
"""
import contextlib
import io
import os
import subprocess
import sys
import tempfile

library, root = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
sys.path.insert(0, os.path.join(root, "bench"))
import profile_step  # noqa: E402

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAILED: {what}")


# A step window of 10 us: two overlapping kernels (1-3, 2-4 us), one nested in
# the first (1.5-2.5 us), a copy (6-7 us), the optimizer (8-8.5 us): busy 4.5 us.
trace = """# kiln_kernel_trace window_ns 1000 11000 dropped 0
start_ns,end_ns,name
1000,3000,"void kiln::layer_norm_forward_kernel<__nv_bfloat16, (int)4>(kiln::Args const&, int)"
2000,4000,"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas"
1500,2500,"void kiln::layer_norm_forward_kernel<__nv_bfloat16, (int)4>(kiln::Args const&, int)"
6000,7000,"[memcpy HtoD 4096 bytes]"
8000,8500,"void kiln::(anonymous namespace)::adamw_kernel<float>(kiln::Chunk*)"
"""
kernels, intervals, window, dropped = profile_step.parse_trace_csv(trace)
check(window == 10000 and dropped == 0, f"window 10000 ns, 0 dropped (got {window}, {dropped})")
check(len(kernels) == 5 and len(intervals) == 5, f"five activities (got {len(kernels)})")
check(profile_step.busy_ns(intervals) == 4500, f"busy 4500 ns (got {profile_step.busy_ns(intervals)})")
check(profile_step.busy_ns([]) == 0, "no activity, no busy time")
check(kernels[0][0] == "kiln::layer_norm_forward_kernel<__nv_bfloat16, (int)4>",
      f"parameters and 'void ' dropped, template arguments kept (got {kernels[0][0]!r})")
check(abs(kernels[3][1] - 1.0) < 1e-9, f"the copy took 1 us (got {kernels[3][1]})")
check(profile_step.family_of(kernels[3][0]) == "copy / cast / fill", "a memcpy is a copy")
check(profile_step.family_of(kernels[4][0]) == "optimizer", "adamw is the optimizer")

for bad, why in ((trace.replace("window_ns 1000 11000", "window_ns 0 0"), "no window"),
                 (trace.replace("# kiln_kernel_trace", "# something else"), "not a kernel trace"),
                 (trace.replace(" dropped 0", ""), "a header without its dropped count")):
    try:
        profile_step.parse_trace_csv(bad)
        check(False, f"{why}: refused")
    except ValueError:
        pass

with tempfile.TemporaryDirectory() as scratch:
    traced = os.path.join(scratch, "kiln.csv")
    with open(traced, "w") as f:
        f.write(trace.replace("dropped 0", "dropped 3"))
    ncu = os.path.join(scratch, "torch.csv")
    with open(ncu, "w") as f:
        f.write('==PROF== Disconnected\n"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
                '"0","ampere_sgemm","gpu__time_duration.sum","usecond","2,000.5"\n')
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        profile_step.print_tables([("kiln", *profile_step.read_side(traced)), ("torch", *profile_step.read_side(ncu))],
                                  top=3)
    text = out.getvalue()
    check("| GPU idle in the window (launch and host overhead) | 55.0% |" in text, "the idle row says 55.0%:\n" + text)
    check("CUPTI dropped 3 activity records" in text, "dropped records are reported")
    check("| GEMM | 0.00 (1) | 2.00 (1) |" in text, "the ncu side's GEMM (2000.5 us) sits beside the trace's:\n" + text)

# The library: InitializeInjection exported, and refused without KILN_KERNEL_TRACE (before it touches CUPTI).
probe = ("import ctypes, sys; init = ctypes.CDLL(sys.argv[1]).InitializeInjection; "
         "sys.exit(10 + init())")
env = {k: v for k, v in os.environ.items() if k != "KILN_KERNEL_TRACE"}
run = subprocess.run([sys.executable, "-c", probe, library], env=env, capture_output=True, text=True)
check(run.returncode == 10, f"InitializeInjection returns 0 without KILN_KERNEL_TRACE (exit {run.returncode}: "
      f"{run.stderr.strip()})")
check("set KILN_KERNEL_TRACE" in run.stderr, f"and says what to set (stderr: {run.stderr.strip()!r})")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("profile_step's trace path and libkiln_kernel_trace.so: all checks passed")
