# Writes argv[1] (emu_attention_tc.inc) from kernels/cuda/attention_tc.cu: the PTX
# wrappers are replaced by emulations (emu_ptx.inc), launch() runs the grid on
# OS threads, and the shared-memory array gets a definition. Everything else
# is the production source, verbatim.
import os, re, sys
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
src = open(os.path.join(root, 'kernels/cuda/attention_tc.cu')).read()
a = src.index('// ---------------------------------------------------------------- PTX wrappers')
b = src.index('// ---------------------------------------------------------------- fragments')
src = src[:a] + '#include "emu_ptx.inc"\n\n' + src[b:]
m = re.search(r'template <typename Kernel>\nvoid launch\(.*?\n}\n', src, re.S)
assert m
src = src[:m.start()] + '''template <typename Kernel>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cuda::Stream, const Params& p, const char* what) {
  emu::run_grid(kernel, blocks, threads, smem, p, what);
}
''' + src[m.end():]
first = src.index('namespace {\n')
src = src[:first] + 'namespace {\nalignas(128) unsigned char attention_tc_smem[232448];\n' + src[first + len('namespace {\n'):]
open(sys.argv[1], 'w').write(src)
print("ok")
