#!/usr/bin/env python3
# Rewrites a CUDA C++ file without inline PTX (kernels/cuda/*.cu) into host
# C++ for emu_cuda.h: python3 gen_cu.py kernels/cuda/norm.cu out.inc [name for #line]
# Only what a host compiler cannot take is rewritten; kernel bodies stay the
# production source, and line numbers are kept (#line) so that diagnostics and
# EMU failures point into the .cu file:
#   kernel<T><<<grid, block[, smem[, stream]]>>>(args)
#       -> ::emu::launch(::emu::Config(grid, block, ...), "kernel<T>",
#                        [](auto&... a) { kernel<T>(a...); }, args)   (deduces the rest, as nvcc)
#   __shared__ T a[n], b[m];   -> static T a[n], b[m]; (per CTA: CTAs run one at a time)
#                                 plus a call that NaN-poisons each array once per CTA
#   extern __shared__ T s[];   -> T* s = the CTA's dynamic shared memory (NaN-poisoned)
#   #include <cub/...>         -> nothing (emu_cuda.h stubs what kiln calls; it throws)
#   --emulate f,g: the definitions of functions f and g (inline-PTX wrappers such as
#       attention.cu's mma_m16n8k16) are removed; the driver defines them first, in the
#       same namespace, with emu_cuda.h's fragment emulations. No other inline PTX is taken.
import re
import sys


def code_flags(src):
    """flags[i]: src[i] is code, not inside a comment or a string/char literal."""
    flags = [True] * len(src)
    i, n = 0, len(src)
    while i < n:
        if src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
        elif src.startswith('/*', i):
            j = src.find('*/', i + 2)
            j = n if j < 0 else j + 2
        elif src[i] in '"\'':
            j = i + 1
            while j < n and src[j] != src[i]:
                j += 2 if src[j] == '\\' else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            flags[k] = False
        i = j
    return flags


def split_top(text, sep=','):
    """Splits at `sep` outside (), [], {} and <> (template arguments)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in '([{<':
            depth += 1
        elif ch in ')]}>':
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def declarator_name(part):
    part = part.split('=')[0]
    part = re.sub(r'(\s*\[[^\]]*\])+\s*$', '', part.strip())
    return re.findall(r'[A-Za-z_]\w*', part)[-1]


def rewrite_shared(src):
    def extern_shared(m):
        type_ = re.sub(r'__align__\s*\([^)]*\)|alignas\s*\([^)]*\)', '', m.group(1)).strip()
        return f'{type_}* {m.group(2)} = reinterpret_cast<{type_}*>(::emu::dynamic_shared());'

    def in_code(rewrite):
        def apply(m):
            return rewrite(m) if flags[m.start()] else m.group(0)
        return apply

    flags = code_flags(src)
    src = re.sub(r'extern\s+__shared__\s+(.*?)\b(\w+)\s*\[\s*\]\s*;', in_code(extern_shared), src)

    def static_shared(m):
        body = m.group(1)
        # The first declarator starts at the last identifier before its '[' or the end.
        parts = split_top(body)
        first = parts[0]
        name = declarator_name(first)
        names = [name] + [declarator_name(p) for p in parts[1:]]
        # &name: an array's address, or a scalar's (transforms.cu's `__shared__ ErasingBox box;`).
        poison = ' '.join(f'::emu::shared_poison(&{n}, sizeof({n}));' for n in names)
        return f'static {body}; {poison}'

    flags = code_flags(src)
    return re.sub(r'(?<![\w])__shared__\s+([^;]*);', in_code(static_shared), src)


def matching_back(src, end, open_ch, close_ch):
    """Index of the open_ch matching src[end] == close_ch, scanning backwards."""
    depth = 0
    for i in range(end, -1, -1):
        if src[i] == close_ch:
            depth += 1
        elif src[i] == open_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError('unbalanced ' + open_ch + close_ch)


def matching_forward(src, start, open_ch, close_ch):
    depth = 0
    for i in range(start, len(src)):
        if src[i] == open_ch:
            depth += 1
        elif src[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise ValueError('unbalanced ' + open_ch + close_ch)


def rewrite_launches(src):
    out, pos, count = [], 0, 0
    flags = code_flags(src)
    while True:
        at = src.find('<<<', pos)
        while at >= 0 and not flags[at]:
            at = src.find('<<<', at + 3)
        if at < 0:
            break
        # The kernel: an identifier (with ::) and optional template arguments, before <<<.
        k = at - 1
        while src[k].isspace():
            k -= 1
        if src[k] == '>':
            k = matching_back(src, k, '<', '>') - 1
        while k >= 0 and (src[k].isalnum() or src[k] in '_:'):
            k -= 1
        kernel_start = k + 1
        kernel = src[kernel_start:at].strip()
        close = src.index('>>>', at)
        config = src[at + 3:close]
        paren = close + 3
        while src[paren].isspace():
            paren += 1
        assert src[paren] == '(', src[at:paren + 20]
        end = matching_forward(src, paren, '(', ')')
        args = src[paren + 1:end]
        name = ' '.join(kernel.split())
        # The kernel through a generic lambda: template arguments the launch leaves to deduction
        # (reduction.cu's reduce_kernel<T><<<...>>>(x, g, red, write, partial)) are deduced from the
        # arguments at the call, as nvcc does; a bare template name could not be passed. [&]: the
        # kernel may be a local (optim.cu's launch_chunks launches its `Kernel kernel` parameter).
        launch = f'::emu::launch(::emu::Config({config}), "{name}", [&](auto&... emu_args) {{ {kernel}(emu_args...); }}'
        launch += (', ' + args if args.strip() else '') + ')'
        # Keep the line count: the newlines of the original span stay in `launch`'s pieces.
        removed = src[kernel_start:end + 1].count('\n') - launch.count('\n')
        out.append(src[pos:kernel_start] + launch + '\n' * removed)
        pos = end + 1
        count += 1
    out.append(src[pos:])
    return ''.join(out), count


def remove_function(src, name):
    """Blanks the definition of function `name` (with its template header), keeping the line count."""
    flags = code_flags(src)
    found = [m for m in re.finditer(r'(template\s*<[^;{}]*>\s*)?__device__\s+__forceinline__\s+[\w:<>]+\s+' + name +
                                    r'\s*\(', src) if flags[m.start()]]
    assert len(found) == 1, f'--emulate {name}: {len(found)} definitions found'
    start = found[0].start()
    close = matching_forward(src, found[0].end() - 1, '(', ')')
    brace = src.index('{', close)
    assert src[close + 1:brace].strip() == '', f'--emulate {name}: no body after the parameters'
    end = matching_forward(src, brace, '{', '}')
    removed = f'/* {name}: emulated (defined by the driver) */' + '\n' * src[start:end + 1].count('\n')
    return src[:start] + removed + src[end + 1:]


def main():
    args = sys.argv[1:]
    emulated = []
    if '--emulate' in args:
        at = args.index('--emulate')
        emulated = [n for n in args[at + 1].split(',') if n]
        del args[at:at + 2]
    path, target = args[0], args[1]
    shown = args[2] if len(args) > 2 else path
    src = open(path).read()
    for name in emulated:
        src = remove_function(src, name)
    assert 'asm(' not in src and 'asm volatile' not in src, 'inline PTX: use an emulation like gen.py/emu_ptx.inc'
    src = re.sub(r'#include\s*<cub/[^>]*>', '// (cub: stubbed by emu_cuda.h)', src)
    src = rewrite_shared(src)
    src, launches = rewrite_launches(src)
    with open(target, 'w') as f:
        f.write(f'#line 1 "{shown}"\n' + src)
    print(f'{path}: {launches} launches rewritten')


if __name__ == '__main__':
    main()
