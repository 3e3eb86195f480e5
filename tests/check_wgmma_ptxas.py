#!/usr/bin/env python3
"""What ptxas makes of the wgmma kernels (kernels/cuda/*_wgmma*.cu), checked in CI.

No GPU runs these kernels in CI, so their two compile-time contracts are checked
here, from ptxas's own report (-Xptxas -v) of the same sources and flags:
 - no "Potential Performance Loss" advisory (C75xx): ptxas serializing the
   products (a wait after each wgmma, e.g. when a non-wgmma instruction touches
   in-flight registers) or ignoring setmaxnreg;
 - no spills, but for the known one (dK/dV at head dim 128: at most 16 bytes);
 - the warp-specialized kernels (PingpongShape<D, G, ...>) launch with exactly
   65536 / (128 (G + 1)) registers per thread, rounded down to 8: their
   setmaxnreg split assumes it (setmaxnreg.inc would hang with fewer).
Usage: check_wgmma_ptxas.py NVCC SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

SPILL_ALLOWED = {("attention_tc_wgmma_dkdv_kernel", 128): 16}


def compile_report(nvcc, root, source, out_dir):
    cubin = os.path.join(out_dir, os.path.basename(source) + ".cubin")
    command = [nvcc, "-DKILN_WITH_CUDA=1", "-I" + root, "-O3", "-DNDEBUG",
               "--generate-code=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-std=c++20",
               "-Xptxas", "-v", "-cubin", source, "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"check_wgmma_ptxas: {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout + done.stderr


def kernels(report):
    """(mangled name, spill store bytes, registers) per entry function, and the advisories."""
    found, name, spill = [], None, None
    advisories = [line for line in report.splitlines() if "(C75" in line]
    for line in report.splitlines():
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            name, spill = entry.group(1), None
        stores = re.search(r"(\d+) bytes spill stores", line)
        if stores and name:
            spill = int(stores.group(1))
        used = re.search(r"Used (\d+) registers", line)
        if used and name:
            found.append((name, spill or 0, int(used.group(1))))
            name = None
    return found, advisories


def main():
    nvcc, root = sys.argv[1], sys.argv[2]
    sources = sorted(glob.glob(os.path.join(root, "kernels/cuda/*_wgmma*.cu")))
    if not sources:
        sys.exit(f"check_wgmma_ptxas: no kernels/cuda/*_wgmma*.cu under {root}")
    failures, checked, pingpong = [], 0, 0
    with tempfile.TemporaryDirectory() as out_dir:
        for source in sources:
            report = compile_report(nvcc, root, source, out_dir)
            found, advisories = kernels(report)
            if not found:
                failures.append(f"{source}: ptxas reported no entry function (has its report changed?)")
            failures += [f"{source}: {line.strip()}" for line in advisories]
            for name, spill, registers in found:
                checked += 1
                short = re.search(r"(attention_tc_wgmma_[a-z_]*kernel)I", name)  # the name, not the namespace
                short = short.group(1) if short else name
                dim = re.search(r"_kernelI\w+?Li(\d+)E", name)
                allowed = SPILL_ALLOWED.get((short, int(dim.group(1)) if dim else 0), 0)
                if spill > allowed:
                    failures.append(f"{short} ({name}): {spill} bytes of spill stores (allowed {allowed})")
                shape = re.search(r"PingpongShapeILi(\d+)ELi(\d+)E", name)
                if shape:
                    pingpong += 1
                    groups = int(shape.group(2))
                    expected = 65536 // (128 * (groups + 1)) // 8 * 8
                    if registers != expected:
                        failures.append(f"{short} (D {shape.group(1)}, {groups} consumer warpgroups): {registers} "
                                        f"registers at launch, its setmaxnreg split needs {expected}")
                types = re.search(r"_kernelI(\w+?)EvN", name)
                print(f"{short}<{types.group(1) if types else '?'}>: {registers} registers, {spill} bytes spilled")
    if pingpong == 0:
        failures.append("no warp-specialized (PingpongShape) kernel found: the register check checked nothing")
    if failures:
        print("check_wgmma_ptxas: FAILED\n  " + "\n  ".join(failures))
        return 1
    print(f"check_wgmma_ptxas: {checked} kernels in {len(sources)} files: no C75xx advisory, spills within bounds, "
          f"{pingpong} warp-specialized kernels at their launch registers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
