#!/usr/bin/env python3
"""Checks the Julia package Pstar against the C header, without Julia.

Usage: check_wrappers.py BUILD_DIR [--self-test]

- Functions: every function the header exports (after the preprocessor) has
  a `ccall((:name, libpstar), Ret, (Args...), ...)` in Pstar.jl, with the
  same number of arguments and, for the result and each argument, a Julia
  type of the same kind and width as the C type (`size_t` only as
  `Csize_t`; enums as 32-bit integers; pointers as Ptr/Ref/Cstring).
- Enums: every `const PSTAR_X = Cint(v)` equals the header's value, and every
  enum constant of the header (but the *_FORCE_32BIT_ markers) is defined.
- Structs: each mirrored struct has the header's field names in order, and
  the offsets and size that C alignment rules give its Julia field types
  equal those a compiled C probe prints for the header's struct.

--self-test also breaks a copy of the Julia source in several ways and
requires each break to be reported (so that the check can fail).
Exit 0 when everything matches, 1 with a list of mismatches otherwise.
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JULIA_SRC = os.path.join(ROOT, "bindings", "julia", "Pstar", "src", "Pstar.jl")
HEADER = os.path.join(ROOT, "capi", "include", "pstar", "pstar.h")
# Julia struct -> C struct.
STRUCTS = {"EngineOptions": "pstar_engine_options", "StepResult": "pstar_step_result", "Stats": "pstar_stats"}

C_SCALARS = {
    "uint32_t": ("uint", 32), "int32_t": ("int", 32), "uint64_t": ("uint", 64), "int64_t": ("int", 64),
    "size_t": ("size", 64), "float": ("float", 32), "double": ("float", 64), "void": ("void", 0),
}
JULIA_SCALARS = {
    "UInt32": ("uint", 32), "Cuint": ("uint", 32), "Int32": ("int", 32), "Cint": ("int", 32),
    "UInt64": ("uint", 64), "Culonglong": ("uint", 64), "Int64": ("int", 64), "Clonglong": ("int", 64),
    "Csize_t": ("size", 64), "Float32": ("float", 32), "Cfloat": ("float", 32), "Float64": ("float", 64),
    "Cdouble": ("float", 64), "Cvoid": ("void", 0), "Cstring": ("ptr", 64),
}
SIZES = {"UInt32": 4, "Int32": 4, "Cint": 4, "Cuint": 4, "Float32": 4, "Cfloat": 4, "UInt64": 8, "Int64": 8,
         "Float64": 8, "Cdouble": 8, "Csize_t": 8, "Culonglong": 8, "Clonglong": 8}


def preprocess(build_dir):
    cc = os.environ.get("CC", "cc")
    out = subprocess.run([cc, "-E", "-P", "-I", os.path.join(ROOT, "capi", "include"), "-I",
                          os.path.join(build_dir, "capi", "include"), HEADER],
                         check=True, capture_output=True, text=True)
    return out.stdout


def parse_header(text):
    enums = {}  # typedef name -> [constant names]
    for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        names = [item.split("=")[0].strip() for item in m.group(2).split(",") if item.strip()]
        enums[m.group(3)] = names
    structs = {}
    for m in re.finditer(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;", text, re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = decl.strip()
            if decl:
                fields.append(decl.split()[-1])
        structs[m.group(3)] = fields
    functions = {}
    for m in re.finditer(r'__attribute__\(\(visibility\("default"\)\)\)\s*([^;(]*?)\b(pstar_\w+)\s*\(([^)]*)\)\s*;',
                         text):
        ret = m.group(1).strip()
        args = [a.strip() for a in m.group(3).split(",") if a.strip() and a.strip() != "void"]
        functions[m.group(2)] = (ret, args)
    return enums, structs, functions


def c_kind(ctype, enum_types):
    ctype = ctype.replace("const", " ").strip()
    if "*" in ctype or ctype.endswith("_fn") or ctype.split()[0].endswith("_fn"):
        return ("ptr", 64)
    base = ctype.split()[0]
    if base in enum_types:
        return ("int", 32)
    return C_SCALARS.get(base, ("unknown:" + base, 0))


def c_arg_type(decl):
    # "const int64_t *shape" -> "const int64_t *"
    decl = decl.strip()
    name = re.search(r"(\w+)\s*$", decl)
    return decl[: name.start()] if name and ("*" in decl or len(decl.split()) > 1) else decl


def julia_kind(jtype):
    jtype = jtype.strip()
    if jtype.startswith("Ptr{") or jtype.startswith("Ref{"):
        return ("ptr", 64)
    return JULIA_SCALARS.get(jtype, ("unknown:" + jtype, 0))


def split_types(tuple_text):
    parts, depth, cur = [], 0, ""
    for ch in tuple_text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return [p for p in parts if p]


def parse_julia(src):
    consts = {m.group(1): int(m.group(3)) for m in
              re.finditer(r"^const\s+(PSTAR_\w+)\s*=\s*(Cint|Int32|UInt32)\((-?\d+)\)", src, re.M)}
    structs = {}
    for m in re.finditer(r"^mutable struct (\w+)\n(.*?)^end", src, re.S | re.M):
        fields = []
        for line in m.group(2).splitlines():
            fm = re.match(r"\s+(\w+)::(\w+)\s*$", line)
            if fm:
                fields.append((fm.group(1), fm.group(2)))
        structs[m.group(1)] = fields
    ccalls = {}
    for m in re.finditer(r"ccall\(\(:(\w+),\s*libpstar\),\s*([\w{}]+),\s*\(([^()]*)\)", src):
        ccalls.setdefault(m.group(1), []).append((m.group(2), split_types(m.group(3))))
    return consts, structs, ccalls


def probe(build_dir, enums, structs):
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <pstar/pstar.h>", "int main(void) {"]
    for names in enums.values():
        for n in names:
            lines.append(f'  printf("E {n} %lld\\n", (long long){n});')
    for s, fields in structs.items():
        lines.append(f'  printf("S {s} %zu\\n", sizeof({s}));')
        for f in fields:
            lines.append(f'  printf("F {s} {f} %zu\\n", offsetof({s}, {f}));')
    lines += ["  return 0;", "}"]
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "probe.c")
        exe = os.path.join(d, "probe")
        with open(c, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        subprocess.run([os.environ.get("CC", "cc"), "-std=c99", "-I", os.path.join(ROOT, "capi", "include"), "-I",
                        os.path.join(build_dir, "capi", "include"), c, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    values, sizes, offsets = {}, {}, {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "E":
            values[parts[1]] = int(parts[2])
        elif parts[0] == "S":
            sizes[parts[1]] = int(parts[2])
        else:
            offsets[(parts[1], parts[2])] = int(parts[3])
    return values, sizes, offsets


def julia_layout(fields):
    offset, align_max, out = 0, 1, []
    for name, jtype in fields:
        size = SIZES.get(jtype)
        if size is None:
            return None, f"field {name}: type {jtype} has no known C size"
        offset = (offset + size - 1) // size * size
        out.append((name, offset))
        offset += size
        align_max = max(align_max, size)
    total = (offset + align_max - 1) // align_max * align_max
    return (out, total), None


def check(src, header, probed):
    enums, structs, functions = header
    values, sizes, offsets = probed
    enum_types = set(enums)
    consts, jstructs, ccalls = parse_julia(src)
    problems = []
    # Functions.
    for name, (ret, args) in sorted(functions.items()):
        if name not in ccalls:
            problems.append(f"{name}: not wrapped")
            continue
        for jret, jargs in ccalls[name]:
            if len(jargs) != len(args):
                problems.append(f"{name}: {len(jargs)} arguments in Julia, {len(args)} in C")
                continue
            if julia_kind(jret) != c_kind(ret, enum_types):
                problems.append(f"{name}: result {jret} vs C {ret}")
            for i, (ja, ca) in enumerate(zip(jargs, args)):
                ck = c_kind(c_arg_type(ca), enum_types)
                jk = julia_kind(ja)
                if jk != ck:
                    problems.append(f"{name}: argument {i + 1} is {ja} in Julia, {ca} in C ({ck[0]} of {ck[1]} bits)")
    for name in sorted(set(ccalls) - set(functions)):
        problems.append(f"{name}: wrapped in Julia but not exported by the header")
    # Enums.
    for names in enums.values():
        for n in names:
            if n.endswith("_FORCE_32BIT_"):
                continue
            if n not in consts:
                problems.append(f"{n}: not defined in Julia")
            elif consts[n] != values[n]:
                problems.append(f"{n}: {consts[n]} in Julia, {values[n]} in C")
    for n in sorted(set(consts) - set(values)):
        problems.append(f"{n}: defined in Julia, not in the header")
    # Structs.
    for jname, cname in STRUCTS.items():
        if jname not in jstructs:
            problems.append(f"struct {jname}: missing in Julia")
            continue
        jfields = jstructs[jname]
        cfields = structs[cname]
        if [f for f, _ in jfields] != cfields:
            problems.append(f"struct {jname}: fields {[f for f, _ in jfields]} differ from {cname}'s {cfields}")
            continue
        layout, err = julia_layout(jfields)
        if err:
            problems.append(f"struct {jname}: {err}")
            continue
        placed, total = layout
        for fname, off in placed:
            if offsets[(cname, fname)] != off:
                problems.append(f"struct {jname}.{fname}: offset {off} in Julia, {offsets[(cname, fname)]} in C")
        if total != sizes[cname]:
            problems.append(f"struct {jname}: size {total} in Julia, {sizes[cname]} in C")
    return problems


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build_dir = sys.argv[1]
    header = parse_header(preprocess(build_dir))
    probed = probe(build_dir, header[0], header[1])
    with open(JULIA_SRC) as fh:
        src = fh.read()
    problems = check(src, header, probed)
    for p in problems:
        print("MISMATCH:", p)
    functions, enum_count = header[2], sum(len(v) for v in header[0].values())
    print(f"checked {len(functions)} functions, {enum_count} enum constants, {len(STRUCTS)} structs: "
          f"{len(problems)} mismatches")
    if "--self-test" in sys.argv:
        breaks = {
            "a 64-bit count passed as Cint": src.replace("(Ptr{Cvoid}, UInt32, Ref{UInt64}), engine, id, out_numel",
                                                           "(Ptr{Cvoid}, UInt32, Ref{Cint}), engine, id, out_numel", 1)
            .replace("UInt32, Ptr{Cvoid}, UInt64, Cint),\n          engine, id, src",
                     "UInt32, Ptr{Cvoid}, Cint, Cint),\n          engine, id, src", 1),
            "a wrapper removed": re.sub(r"pstar_trace_export\(engine, path\) =\n.*\n", "", src, count=1),
            "an argument dropped": src.replace("(Ptr{Cvoid}, UInt32, Float32), engine, id, lr_scale",
                                               "(Ptr{Cvoid}, Float32), engine, lr_scale", 1),
            "an enum value changed": src.replace("const PSTAR_ERR_BUSY = Cint(-6)", "const PSTAR_ERR_BUSY = Cint(-7)", 1),
            "a struct field's width changed": src.replace("    threads::UInt32\n", "    threads::UInt64\n", 1),
            "a struct field missing": src.replace("    collectives::UInt64\n", "", 1),
        }
        undetected = []
        for what, broken in breaks.items():
            if broken == src:
                undetected.append(f"{what} (the break did not apply)")
            elif not check(broken, header, probed):
                undetected.append(what)
        for u in undetected:
            print("SELF-TEST: not detected:", u)
        print(f"self-test: {len(breaks) - len(undetected)} of {len(breaks)} breaks detected")
        if undetected:
            return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
