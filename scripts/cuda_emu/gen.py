# Writes argv[1] (emu_attention_tc.inc) from the tensor-core attention's
# sources: the translation units below, concatenated in order, with each
# kernels/cuda/attention_tc_*.cuh and attention_common.cuh they include inlined
# once. The PTX wrappers (attention_tc_ptx.cuh, between its "PTX wrappers" and
# "fragments" markers) are replaced by emulations (emu_ptx.inc), launch()
# (attention_common.cuh) by one that runs the grid on OS threads, defined after
# the emulations, and the shared-memory array gets a definition. Everything
# else is the production source, verbatim.
import os, re, sys
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
units = ['attention_tc_forward.cu', 'attention_tc_backward.cu', 'attention_tc.cu', 'attention_tc_wgmma.cu',
         'attention_tc_wgmma_backward.cu', 'attention_tc_wgmma_pingpong.cu']
seen = set()
def expand(name):
    if name in seen:
        return ''
    seen.add(name)
    text = open(os.path.join(root, 'kernels/cuda', name)).read()
    return re.sub(r'#include "kernels/cuda/(attention_(?:tc\w*|common)\.cuh)"\n', lambda m: expand(m.group(1)), text)
src = ''.join(expand(unit) for unit in units)
m = re.search(r'template <typename Kernel, typename Params>\nvoid launch\(.*?\n}\n', src, re.S)
assert m
src = src[:m.start()] + src[m.end():]
a = src.index('// ---------------------------------------------------------------- PTX wrappers')
b = src.index('// ---------------------------------------------------------------- fragments')
# Inside attention_tc_ptx.cuh's namespace kiln::kernels::attention_tc { namespace {, where the kernels are too.
src = src[:a] + '''alignas(1024) unsigned char attention_tc_smem[232448];
#include "emu_ptx.inc"

template <typename Kernel, typename Params>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cuda::Stream, const Params& p, const char* what) {
  emu::run_grid(kernel, blocks, threads, smem, p, what);
}

''' + src[b:]
a = src.index('// ---------------------------------------------------------------- wgmma wrappers')
b = src.index('// ---------------------------------------------------------------- wgmma end')
src = src[:a] + '#include "emu_wgmma.inc"\n\n' + src[b:]
open(sys.argv[1], 'w').write(src)
print("ok")
