#!/usr/bin/env python3
"""Compares builds of the AVX-512 (or AVX2) int8 Adam kernel in one program, in alternation.

pstar-bench links the kernels statically, so comparing two commits with it
means two binaries run minutes apart; on a shared 2-core machine the int8
kernel's speed moves by 10-20% over minutes (and LD_LIBRARY_PATH does not
swap the kernel). This script compiles src/optim/adam_states_avx512.cpp
(--isa avx2: adam_states_avx2.cpp) once per variant, with its exported functions renamed, links all of them into
bench/int8_kernel_ab.cpp's harness against the build's libpstar_core.a, and
times them on one thread, each round in a shuffled order (1024-element
range in L1, as pstar-bench's compute ceiling).

Variants:
  --rev NAME=REV       the file at git revision REV (e.g. HEAD, f20f04f), with
                       that revision's inline-only kernel headers
                       (INLINE_HEADERS: the lane helpers and the prefetch)
                       ahead of the tree's, so that a kernel from before a
                       change to them still builds and measures as it was;
                       every other header (the int8 maps' layout, the
                       declarations) is the working tree's, as the library
                       it links
  --source NAME=PATH   a file on disk
  --ablate NAME=KIND   the working tree's file with a part removed, to see
                       what it costs (the results then differ by design):
                       no-quant (the two quantizations of each block),
                       no-dequant (a plain conversion instead of the map
                       lookups, VBMI path), no-vbmi (the 32-wide 16-bit
                       lookup instead of VBMI's); with --isa avx2 only
                       no-quant.
The first variant is the reference: every other's lists are compared with it
after a warm-up (same_bits_as_first) and its times divided by theirs
(`speedup_vs_first`, > 1: faster than the first).

Code layout moves such a kernel by several percent, so the program is linked
--links times, the variants' objects in rotated orders; each link's medians
are reported, and their spread is the figure's resolution.

Run from the source root after a build:
  python3 bench/int8_kernel_ab.py --build-dir build/default --rev old=f20f04f --rev new=HEAD
Prints one JSON object.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

KERNELS = {"avx512": "src/optim/adam_states_avx512.cpp", "avx2": "src/optim/adam_states_avx2.cpp"}
# Headers of always-inline code only (nothing the library defines): a --rev
# variant takes them from its revision.
INLINE_HEADERS = ["src/optim/adam_lanes_avx512.h", "src/optim/adam_lanes_avx2.h", "src/optim/adam_prefetch.h"]
FLAGS = ["-O2", "-DNDEBUG", "-ffp-contract=off", "-fno-fast-math", "-fno-math-errno", "-std=c++17"]

# The two quantizations of a block (each place the kernel makes them): macro
# lines (AVX-512) or plain ones (AVX2).
QUANT_CALLS = re.compile(
    r"( *)quant_block<true>\(sq, ([^,]+), [^\n]*?(\\?)\n *quant_block<false[^>]*>\(uq, ([^,]+), [^\n]*?\\?\n")
# The AVX-512 kernel's 64-value quantizations inside its fused pass (one
# line each, in a macro).
QUANT64_CALLS = re.compile(r"( *)quant64<[^>]*>\((sq|uq), ([^,]+), [^\n]*?;( *\\?)\n")
DEQUANT64_BODY = re.compile(
    r"(PSTAR_AVX512VBMI void dequant_step64\([^)]*\) \{\n)(.*?)(\n\})", re.S)


def ablate(text, kind, isa):
    if isa != "avx512" and kind != "no-quant":
        sys.exit("int8_kernel_ab: ablation %s applies to the AVX-512 kernel only" % kind)
    if kind == "no-quant":
        out, count = QUANT_CALLS.subn(
            lambda m: '%s(void)sq; (void)uq; asm volatile("" ::"r"(%s), "r"(%s) : "memory"); %s\n'
            % (m.group(1), m.group(2), m.group(4), m.group(3)), text)
        out, count64 = QUANT64_CALLS.subn(
            lambda m: '%s(void)%s; asm volatile("" ::"r"(%s) : "memory");%s\n' % (m.group(1), m.group(2), m.group(3),
                                                                                 m.group(4)), out)
        count = min(count + count64, 1)  # the AVX-512 kernel quantizes in several places
    elif kind == "no-dequant":
        body = ("  (void)m; (void)left;\n"
                "  for (int q = 0; q < 4; ++q)\n"
                "    out[q] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(\n"
                "        _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * q))));")
        out, count = DEQUANT64_BODY.subn(lambda m: m.group(1) + body + m.group(3), text)
    elif kind == "no-vbmi":
        out, count = re.subn(r"\n  if \(vbmi\) \{", "\n  if (false && vbmi) {", text)
    else:
        sys.exit("int8_kernel_ab: unknown ablation %r (no-quant, no-dequant, no-vbmi)" % kind)
    if count != 1:
        sys.exit("int8_kernel_ab: ablation %s does not apply to this kernel (matched %d times)" % (kind, count))
    return out


def split_spec(spec, what):
    if "=" not in spec:
        sys.exit("int8_kernel_ab: %s wants NAME=VALUE, got %r" % (what, spec))
    name, value = spec.split("=", 1)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        sys.exit("int8_kernel_ab: variant name %r is not an identifier" % name)
    return name, value


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build/default", help="a configured and built tree (libpstar_core.a)")
    ap.add_argument("--isa", choices=sorted(KERNELS), default="avx512", help="the kernel compared")
    ap.add_argument("--rev", action="append", default=[], metavar="NAME=REV", help="the kernel at a git revision")
    ap.add_argument("--source", action="append", default=[], metavar="NAME=PATH", help="the kernel from a file")
    ap.add_argument("--ablate", action="append", default=[], metavar="NAME=KIND",
                    help="the working tree's kernel without a part: no-quant, no-dequant, no-vbmi")
    ap.add_argument("--rounds", type=int, default=60, help="samples per variant per link")
    ap.add_argument("--calls", type=int, default=256, help="kernel calls (1024 elements each) per sample")
    ap.add_argument("--links", type=int, default=2, help="programs linked with the objects in rotated orders")
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"), help="C++ compiler")
    ap.add_argument("--core", help="libpstar_core.a to link (default: BUILD_DIR/lib/libpstar_core.a)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every no-vbmi variant gives the first variant's bits and every no-quant "
                         "variant (and no-dequant, where the CPU has VBMI) does not (a smoke test of the ablations)")
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(args.build_dir)
    core = os.path.abspath(args.core) if args.core else os.path.join(build, "lib", "libpstar_core.a")
    if not os.path.exists(core):
        sys.exit("int8_kernel_ab: %s not found: build first (cmake --build %s)" % (core, args.build_dir))
    kernel = KERNELS[args.isa]
    variants = []  # (name, text)
    kinds = {}  # name -> ablation kind
    rev_headers = {}  # name -> {path under src/: text} of a --rev variant's INLINE_HEADERS
    for spec in args.rev:
        name, rev = split_spec(spec, "--rev")
        proc = subprocess.run(["git", "-C", root, "show", "%s:%s" % (rev, kernel)], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit("int8_kernel_ab: git show %s:%s failed: %s" % (rev, kernel, proc.stderr.strip()))
        variants.append((name, proc.stdout))
        rev_headers[name] = {}
        for h in INLINE_HEADERS:
            hp = subprocess.run(["git", "-C", root, "show", "%s:%s" % (rev, h)], capture_output=True, text=True)
            if hp.returncode == 0:  # absent at that revision: the tree's (if the kernel includes it at all)
                rev_headers[name][os.path.relpath(h, "src")] = hp.stdout
    for spec in args.source:
        name, path = split_spec(spec, "--source")
        with open(path) as f:
            variants.append((name, f.read()))
    with open(os.path.join(root, kernel)) as f:
        working = f.read()
    for spec in args.ablate:
        name, kind = split_spec(spec, "--ablate")
        variants.append((name, ablate(working, kind, args.isa)))
        kinds[name] = kind
    if len(variants) < 2:
        sys.exit("int8_kernel_ab: give at least two variants (--rev, --source, --ablate)")
    if len({n for n, _ in variants}) != len(variants):
        sys.exit("int8_kernel_ab: variant names must differ")

    includes = ["-I" + os.path.join(root, "src"), "-I" + os.path.join(root, "capi", "include"),
                "-I" + os.path.join(build, "capi", "include")]
    tmp = tempfile.mkdtemp(prefix="int8_kernel_ab.")
    try:
        objs = []
        for name, text in variants:
            # The copy sits in src/optim's place so that its includes resolve as in the tree.
            src = os.path.join(tmp, name + ".cpp")
            with open(src, "w") as f:
                f.write(text)
            obj = os.path.join(tmp, name + ".o")
            renames = ["-D%s_%s=%s_%s_%s" % (fn, args.isa, fn, args.isa, name)
                       for fn in ("adam_states_int8", "adam_states_bf16", "int8_encode")]
            own = []
            if rev_headers.get(name):
                inc = os.path.join(tmp, name + "_include")
                for rel, htext in rev_headers[name].items():
                    os.makedirs(os.path.join(inc, os.path.dirname(rel)), exist_ok=True)
                    with open(os.path.join(inc, rel), "w") as f:
                        f.write(htext)
                own = ["-I" + inc]
            subprocess.run([args.cxx] + FLAGS + own + includes + renames + ["-c", src, "-o", obj], check=True)
            objs.append(obj)
        names = [n for n, _ in variants]
        per_link = []
        for link in range(args.links):
            k = link % len(objs)
            order = objs[k:] + objs[:k]
            exe = os.path.join(tmp, "ab%d" % link)
            macro = "-DPSTAR_AB_VARIANTS=" + " ".join("X(%s)" % n for n in names)
            isa_macro = ["-DPSTAR_AB_AVX2"] if args.isa == "avx2" else []
            subprocess.run([args.cxx] + FLAGS + includes + isa_macro + [macro, os.path.join(root, "bench", "int8_kernel_ab.cpp")]
                           + order + [core, "-lpthread", "-o", exe], check=True)
            proc = subprocess.run([exe, str(args.rounds), str(args.calls), str(link + 1)], capture_output=True,
                                  text=True)
            if proc.returncode == 77:
                print("int8_kernel_ab: skipped: %s" % proc.stderr.strip(), file=sys.stderr)
                return 77
            if proc.returncode != 0:
                sys.exit("int8_kernel_ab: the harness failed (%d): %s" % (proc.returncode, proc.stderr))
            per_link.append({json.loads(line)["variant"]: json.loads(line) for line in proc.stdout.splitlines()})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    first = names[0]
    out = {"bench": "int8_kernel_ab", "isa": args.isa, "threads": 1, "elements": 1024, "rounds": args.rounds, "calls": args.calls,
           "links": args.links, "reference": first, "variants": []}
    for n in names:
        medians = [r[n]["ns_per_elem_median"] for r in per_link]
        speedups = [r[first]["ns_per_elem_median"] / r[n]["ns_per_elem_median"] for r in per_link]
        out["variants"].append({
            "variant": n,
            "same_bits_as_first": all(r[n]["same_bits_as_first"] for r in per_link),
            "ns_per_elem_median_per_link": [round(x, 5) for x in medians],
            "ns_per_elem_min": round(min(r[n]["ns_per_elem_min"] for r in per_link), 5),
            "speedup_vs_first_per_link": [round(x, 4) for x in speedups],
            "speedup_vs_first": round(statistics.median(speedups), 4),
        })
    out["vbmi"] = per_link[0][first]["vbmi"]
    out["avx512bf16"] = per_link[0][first]["avx512bf16"]
    print(json.dumps(out))
    if args.check:
        bad = []
        for v in out["variants"]:
            kind = kinds.get(v["variant"])
            want_same = {"no-vbmi": True, "no-quant": False, "no-dequant": not out["vbmi"]}.get(kind)
            if want_same is not None and v["same_bits_as_first"] != want_same:
                bad.append("%s (%s): same_bits_as_first %s" % (v["variant"], kind, v["same_bits_as_first"]))
        if bad:
            print("int8_kernel_ab: check failed: " + "; ".join(bad), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
