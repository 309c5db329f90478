#!/usr/bin/env python3
"""libpstar's ABI check: the built libpstar.so against the committed baseline
(packaging/abi/libpstar.abi, abidw XML of the released library).

Policy (docs/api-stability.md):
  - a changed SONAME (new major) passes: the baseline belongs to the old major
    and is regenerated with packaging/abi/update-baseline.sh;
  - new functions pass;
  - fields appended to a versioned struct pass (the suppression file names
    the structs), provided every field the baseline has keeps its name,
    offset and type;
  - experimental functions (pstar_x_*) may change or go;
  - anything else abidiff reports fails.

Usage:
  check_abi.py --lib LIB --baseline ABI --suppressions FILE --headers DIR
  check_abi.py --self-test    builds small libraries in pairs and checks that
                              the policy accepts and rejects what it should
Exit status: 0 pass, 1 fail, 77 skipped (tools or debug information missing).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SKIP = 77


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def has_dwarf(lib):
    out = run(["readelf", "-S", "--wide", lib]).stdout
    return ".debug_info" in out


def versioned_struct_regexp(suppressions):
    with open(suppressions) as f:
        for line in f:
            m = re.match(r"\s*name_regexp\s*=\s*(\S+)\s*$", line)
            if m:
                return re.compile(m.group(1))
    sys.exit(f"check_abi: no name_regexp in {suppressions}")


def abidw(lib, headers, out):
    cmd = ["abidw", "--exported-interfaces-only", "--no-show-locs", "--no-corpus-path", "--no-comp-dir-path",
           "--drop-private-types", "--out-file", out, lib]
    if headers:
        cmd[1:1] = ["--headers-dir", headers]
    r = run(cmd)
    if r.returncode != 0:
        sys.exit(f"check_abi: abidw failed:\n{r.stdout}")


class Corpus:
    """Types of an abidw XML corpus, enough to name a member's type."""

    def __init__(self, path):
        root = ET.parse(path).getroot()
        self.soname = root.get("soname", "")
        self.by_id = {}
        self.structs = {}
        for el in root.iter():
            tid = el.get("id")
            if tid:
                self.by_id[tid] = el
            if el.tag == "class-decl" and el.get("name") and el.find("data-member") is not None:
                self.structs[el.get("name")] = el

    def type_name(self, tid, depth=0):
        el = self.by_id.get(tid)
        if el is None or depth > 8:
            return tid
        size = el.get("size-in-bits", "")
        if el.tag == "pointer-type-def":
            return self.type_name(el.get("type-id"), depth + 1) + "*"
        if el.tag == "qualified-type-def":
            q = " ".join(k for k in ("const", "volatile") if el.get(k) == "yes")
            return f"{q} {self.type_name(el.get('type-id'), depth + 1)}"
        if el.tag == "typedef-decl":
            return f"{el.get('name')}={self.type_name(el.get('type-id'), depth + 1)}"
        if el.tag == "array-type-def":
            dims = [s.get("length", "?") for s in el.findall("subrange")]
            return f"{self.type_name(el.get('type-id'), depth + 1)}[{']['.join(dims)}]"
        return f"{el.get('name', el.tag)}:{size}"

    def members(self, struct):
        out = []
        for dm in struct.findall("data-member"):
            var = dm.find("var-decl")
            out.append((var.get("name"), dm.get("layout-offset-in-bits"), self.type_name(var.get("type-id"))))
        return out


def check(lib, baseline, suppressions, headers, quiet=False):
    """Returns a list of problems (empty: the library keeps the baseline's ABI)."""
    say = (lambda *a: None) if quiet else print
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        current_xml = os.path.join(tmp, "current.abi")
        abidw(lib, headers, current_xml)
        base, cur = Corpus(baseline), Corpus(current_xml)
        if base.soname != cur.soname:
            say(f"check_abi: SONAME changed from {base.soname} to {cur.soname}: a new major version; "
                "the baseline belongs to the old one (packaging/abi/update-baseline.sh)")
            return []
        # Everything abidiff reports, except added functions and the allowed
        # appends.
        cmd = ["abidiff", "--exported-interfaces-only", "--no-added-syms", "--suppressions", suppressions,
               baseline, current_xml]
        r = run(cmd)
        if r.returncode != 0:
            problems.append(f"abidiff (exit {r.returncode}):\n{r.stdout}")
        # The appends' prefix: every baseline member of a versioned struct
        # unchanged.
        versioned = versioned_struct_regexp(suppressions)
        for name, struct in sorted(base.structs.items()):
            if not versioned.match(name):
                continue
            if name not in cur.structs:
                problems.append(f"versioned struct {name} is gone")
                continue
            now = {m[0]: m for m in cur.members(cur.structs[name])}
            for member in base.members(struct):
                got = now.get(member[0])
                if got != member:
                    problems.append(f"{name}.{member[0]}: was offset {member[1]} bits, {member[2]}; now " +
                                    (f"offset {got[1]} bits, {got[2]}" if got else "missing"))
        added = run(["abidiff", "--exported-interfaces-only", "--suppressions", suppressions, baseline,
                     current_xml]).stdout
        for line in added.splitlines():
            if line.strip().startswith("[A]"):
                say(f"check_abi: added (allowed): {line.strip()}")
    return problems


SELF_TEST_BASE = """
#include <stdint.h>
typedef struct pstar_engine_options { uint32_t size; uint32_t version; int a; } pstar_engine_options;
typedef struct pstar_pair { int x; int y; } pstar_pair;
typedef enum pstar_kind { PSTAR_KIND_A = 0, PSTAR_KIND_B = 1 } pstar_kind;
int pstar_f(pstar_engine_options *o) { return o->a; }
int pstar_h(pstar_pair *p, pstar_kind k) { return p->x + (int)k; }
int pstar_gone(void) { return 0; }
int pstar_x_trial(int a) { return a; }
"""

# (name, edit of the base source, expected verdict)
SELF_TEST_CASES = [
    ("unchanged", lambda s: s, True),
    ("append to a versioned struct", lambda s: s.replace("int a; }", "int a; int b; }"), True),
    ("new function", lambda s: s + "int pstar_new(void) { return 1; }\n", True),
    ("member type in a versioned struct", lambda s: s.replace("int a; }", "long a; }"), False),
    ("member renamed in a versioned struct", lambda s: s.replace("int a; }", "int c; }").replace("o->a", "o->c"),
     False),
    ("member inserted before the end", lambda s: s.replace("uint32_t version; int a;", "uint32_t version; int z; int a;"),
     False),
    ("append to an unversioned struct", lambda s: s.replace("int y; }", "int y; int z; }"), False),
    ("removed function", lambda s: s.replace("int pstar_gone(void) { return 0; }", ""), False),
    ("parameter type", lambda s: s.replace("pstar_pair *p, pstar_kind k", "pstar_pair *p, long k"), False),
    ("experimental function changed", lambda s: s.replace("pstar_x_trial(int a)", "pstar_x_trial(long a)"), True),
    ("experimental function removed", lambda s: s.replace("int pstar_x_trial(int a) { return a; }", ""), True),
    ("enumerator value", lambda s: s.replace("PSTAR_KIND_B = 1", "PSTAR_KIND_B = 2"), False),
]


def self_test(suppressions):
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        def build(name, source):
            c = os.path.join(tmp, name + ".c")
            lib = os.path.join(tmp, f"lib{name}.so")
            with open(c, "w") as f:
                f.write(source)
            r = run(["cc", "-g", "-O0", "-shared", "-fPIC", "-Wl,-soname,libselftest.so.0", c, "-o", lib])
            if r.returncode != 0:
                sys.exit(f"check_abi: self-test compile failed:\n{r.stdout}")
            return lib

        baseline = os.path.join(tmp, "base.abi")
        abidw(build("base", SELF_TEST_BASE), None, baseline)
        for i, (name, edit, ok) in enumerate(SELF_TEST_CASES):
            problems = check(build(f"case{i}", edit(SELF_TEST_BASE)), baseline, suppressions, None, quiet=True)
            verdict = not problems
            status = "ok" if verdict == ok else "WRONG"
            failures += verdict != ok
            print(f"self-test: {name}: {'accepted' if verdict else 'rejected'} ({status})")
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib")
    ap.add_argument("--baseline")
    ap.add_argument("--suppressions", required=True)
    ap.add_argument("--headers")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    for tool in ("abidw", "abidiff", "readelf"):
        if shutil.which(tool) is None:
            print(f"skipped: {tool} not found (Debian: abigail-tools, binutils)")
            return SKIP
    if a.self_test:
        failures = self_test(a.suppressions)
        print(f"self-test: {len(SELF_TEST_CASES) - failures} of {len(SELF_TEST_CASES)} verdicts right")
        return 1 if failures else 0
    if not has_dwarf(a.lib):
        print(f"skipped: {a.lib} has no debug information (the ABI check reads types from DWARF: "
              "build with RelWithDebInfo or Debug)")
        return SKIP
    problems = check(a.lib, a.baseline, a.suppressions, a.headers)
    for p in problems:
        print(f"check_abi: INCOMPATIBLE: {p}")
    if not problems:
        print(f"check_abi: {a.lib} keeps the ABI of {a.baseline}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
