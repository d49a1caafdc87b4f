#!/usr/bin/env python3
"""bench/sass_diff.py: proves that a move of code (files split, private namespaces renamed) left
every kernel's machine code as it was. It dumps the SASS of CUDA objects per architecture and per
function, and compares two such dumps function by function, byte for byte.

  bench/sass_diff.py build-extra OUT            # objects CMake does not build here (below), into OUT
  bench/sass_diff.py dump DIR OBJ...            # DIR/<object>/<arch>/<n>.sass + DIR/index.tsv
  bench/sass_diff.py diff BEFORE AFTER          # a Markdown table; exit 1 on any difference
                                                # (BEFORE, AFTER: dump folders, several joined by commas)

`dump` runs `cuobjdump -sass -arch sm_89` and `-arch sm_90a` on each object (cuobjdump and the
nvdisasm it calls must be on PATH or in $CUOBJDUMP_DIR; the pip packages nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm carry both: `pip install --target /tmp/cuobjdump nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, then PATH=/tmp/cuobjdump/nvidia/cu13/bin:$PATH). Each function is keyed by
its demangled name with the renames below applied, so that a kernel whose namespace was renamed
is compared with itself; the same renames apply to names inside the code (call targets). Nothing
else is normalized: the instructions, their encodings, addresses and constant-bank offsets must
match exactly. Functions are compared as sets (a move may change the order of definitions).

RENAMES lists the namespace renames of the move (old prefix, new prefix of a demangled name).

`build-extra` compiles the translation units that instantiate attention, GEMM and quantize kernels
but that this build leaves out (python/csrc's CUDA parts are built only where torch sees a GPU;
the examples are off in the build the comparison uses), with the flags their CMake targets use,
for sm_89 and sm_90a. Environment: SASS_DIFF_SRC (the source tree, default this repository),
SASS_DIFF_ONLY (a regex on the sources, e.g. attention), SASS_DIFF_JOBS (parallel compiles, 2).
The CMake-built objects (tests/cuda, bench/gpu) are dumped from the build folder. Building both
sides from `git archive` trees of the same path length (the CMake ones with their build commands,
the tree's path put for /work/main) keeps the work tree free to change meanwhile. Typical use
(record the "before" outside the repository):

  ninja -C build/x <the .cu.o of tests/cuda/{attention,gemm,quant,linear}_device, graph_capture,
                   bench/gpu/{attention_fp8,gemm_tflops,quant_bandwidth}>
  SASS_DIFF_SRC=/tmp/src_before bench/sass_diff.py build-extra /tmp/sass_obj_before
  bench/sass_diff.py dump /tmp/sass_before $(find build/x /tmp/sass_obj_before -name '*.o')
  ... the change ...; the same three commands into /tmp/sass_after ...
  bench/sass_diff.py diff /tmp/sass_before /tmp/sass_after
"""
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys

ARCHS = ("sm_89", "sm_90a")

# (old, new): a demangled name (or a name in the code) starting a qualified name with `old` is read
# as if it started with `new`.
# (gemm's and quant's move to gemm/detail/ and quant/detail/ kept their `octet::detail` names: none.)
RENAMES = (
    ("octet::attn_kernel::", "octet::detail::attention::"),
    ("octet::attn_frag::", "octet::detail::attention::"),
    ("octet::attn::", "octet::detail::attention::"),
)

# The source tree build-extra compiles: this repository, or $SASS_DIFF_SRC (for example a
# `git archive` of the commit before the move, so that the work tree can change meanwhile).
ROOT = os.environ.get("SASS_DIFF_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# build-extra: (source, extra flags). The flags are those of the source's CMake target.
EXTRA_COMMON = ["-O3", "-DNDEBUG", "-std=c++17", "-I" + os.path.join(ROOT, "include"),
                "--generate-code=arch=compute_89,code=[compute_89,sm_89]",
                "--generate-code=arch=compute_90a,code=[compute_90a,sm_90a]"]
TORCH_FLAGS = ["-DOCTET_TORCH_CUDA", "-Xcompiler=-fPIC", "-Xcompiler=-Wall,-Wextra,-fno-math-errno"]


def extra_sources():
    csrc = os.path.join(ROOT, "python", "csrc")
    out = []
    for name in sorted(os.listdir(csrc)):
        if name.endswith(".cu") and re.match(r"(attention|gemm|linear|quant)_device_", name):
            if name.startswith("quant_device_cast_"):
                continue  # format conversions only: no quantize, GEMM or attention kernel
            out.append((os.path.join("python", "csrc", name), TORCH_FLAGS))
    out.append((os.path.join("examples", "03_scaled_gemm", "main.cu"), []))
    out.append((os.path.join("examples", "08_training", "cuda_linear.cu"), []))
    return out


def tool(name):
    d = os.environ.get("CUOBJDUMP_DIR")
    if d and os.path.exists(os.path.join(d, name)):
        return os.path.join(d, name)
    found = shutil.which(name)
    if not found:
        sys.exit(f"sass_diff: {name} not found (see the header of {sys.argv[0]})")
    return found


def build_extra(out):
    os.makedirs(out, exist_ok=True)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"

    def one(item):
        src, flags = item
        obj = os.path.join(out, src.replace(os.sep, "__") + ".o")
        cmd = [nvcc] + EXTRA_COMMON + flags + ["-c", os.path.join(ROOT, src), "-o", obj]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"sass_diff: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        return src

    jobs = int(os.environ.get("SASS_DIFF_JOBS", "2"))
    only = re.compile(os.environ.get("SASS_DIFF_ONLY", ""))  # e.g. SASS_DIFF_ONLY=attention
    with concurrent.futures.ThreadPoolExecutor(jobs) as ex:
        for src in ex.map(one, [s for s in extra_sources() if only.search(s[0])]):
            print("built", src, flush=True)


def object_key(path):
    """A short, stable name for an object: its path without the build folder's CMake noise."""
    p = os.path.abspath(path)
    m = re.search(r"CMakeFiles/[^/]+\.dir/(.*)$", p)
    if m:
        p = m.group(1)
    else:
        p = os.path.basename(p)
    return p[:-2] if p.endswith(".o") else p


def demangle(names):
    if not names:
        return {}
    r = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    out = r.stdout.split("\n")
    return {n: out[i] for i, n in enumerate(names)}


def rename(s):
    for old, new in RENAMES:
        s = s.replace(old, new)
    return s


CODE_NAME = re.compile(r"`\(([^)]*)\)")


def split_functions(text):
    """(mangled name, body lines) per function of one cuobjdump -sass listing."""
    funcs = []
    name, body = None, []
    for line in text.split("\n"):
        m = re.match(r"\s*Function : (\S+)\s*$", line)
        if m:
            if name is not None:
                funcs.append((name, body))
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        if re.match(r"\s*\.{10}\s*$", line):  # end of the function
            funcs.append((name, body))
            name, body = None, []
            continue
        body.append(line.rstrip())
    if name is not None:
        funcs.append((name, body))
    return funcs


def dump(outdir, objects):
    cuobjdump = tool("cuobjdump")
    env = dict(os.environ)
    nvdisasm = shutil.which("nvdisasm") or (os.path.join(os.environ.get("CUOBJDUMP_DIR", ""), "nvdisasm"))
    if nvdisasm and os.path.exists(nvdisasm):
        env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    os.makedirs(outdir, exist_ok=True)
    index = []
    for obj in objects:
        key = object_key(obj)
        for arch in ARCHS:
            r = subprocess.run([cuobjdump, "-sass", "-arch", arch, obj], capture_output=True, text=True, env=env)
            if r.returncode != 0:
                sys.exit(f"sass_diff: cuobjdump -sass -arch {arch} {obj}: {r.stderr}")
            funcs = split_functions(r.stdout)
            names = sorted({n for n, _ in funcs} | {m for _, b in funcs for line in b for m in CODE_NAME.findall(line)})
            dm = demangle(names)
            d = os.path.join(outdir, key, arch)
            os.makedirs(d, exist_ok=True)
            for n, body in funcs:
                norm = rename(dm[n])
                text = "\n".join(CODE_NAME.sub(lambda m: "`(" + rename(dm.get(m.group(1), m.group(1))) + ")", line)
                                 for line in body) + "\n"
                fname = hashlib.sha1(norm.encode()).hexdigest()[:16] + ".sass"
                with open(os.path.join(d, fname), "w") as f:
                    f.write(text)
                index.append((key, arch, fname, norm, n))
            print(f"{key} {arch}: {len(funcs)} functions", flush=True)
    with open(os.path.join(outdir, "index.tsv"), "w") as f:
        for row in index:
            f.write("\t".join(row) + "\n")


def read_index(dirs):
    """The functions of one or more dumps (folders joined by commas)."""
    rows = {}
    for d in dirs.split(","):
        with open(os.path.join(d, "index.tsv")) as f:
            for line in f:
                key, arch, fname, norm, raw = line.rstrip("\n").split("\t")
                rows.setdefault((key, arch), {})[norm] = (os.path.join(d, key, arch, fname), raw)
    return rows


def diff(before, after):
    a, b = read_index(before), read_index(after)
    bad = 0
    print("| object | arch | kernels before | kernels after | identical | renamed (same code) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    total = [0, 0, 0]
    details = []
    for key, arch in sorted(set(a) | set(b)):
        fa, fb = a.get((key, arch), {}), b.get((key, arch), {})
        same = renamed = 0
        for norm, (fname, raw) in fa.items():
            if norm not in fb:
                details.append(f"only before: {key} {arch} {norm}")
                continue
            with open(fname) as x, open(fb[norm][0]) as y:
                if x.read() == y.read():
                    same += 1
                    renamed += raw != fb[norm][1]
                else:
                    details.append(f"differs: {key} {arch} {norm}")
        for norm in fb:
            if norm not in fa:
                details.append(f"only after: {key} {arch} {norm}")
        ok = same == len(fa) == len(fb)
        bad += not ok
        total[0] += len(fa)
        total[1] += same
        total[2] += renamed
        print(f"| {key} | {arch} | {len(fa)} | {len(fb)} | {same}{'' if ok else ' (!)'} | {renamed} |")
    print(f"| all | | {total[0]} | | {total[1]} | {total[2]} |")
    for line in details:
        print(line, file=sys.stderr)
    return 1 if bad else 0


def main(argv):
    if len(argv) >= 2 and argv[0] == "build-extra":
        build_extra(argv[1])
    elif len(argv) >= 3 and argv[0] == "dump":
        dump(argv[1], argv[2:])
    elif len(argv) == 3 and argv[0] == "diff":
        return diff(argv[1], argv[2])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
