#!/usr/bin/env python3
"""Checks that every command in docs/benchmarks.md's "Current figures" table exists as written.

Reads the table rows between "## Current figures" and the next "## " heading,
takes each row's command (the last backticked span of its last cell) and
checks, without running the benchmark:

- `build/default/bin/pstar-bench SUB ...` (or `pstar-bench SUB ...`, the
  program named without its folder): SUB is one of the subcommands that
  `pstar-bench --help` lists, and every `--flag` of the command appears in
  `pstar-bench SUB --help`;
- `build/default/bin/pstar-plan ...` (or `pstar-plan ...`): every `--flag`
  appears in `pstar-plan --help`;
- `... python bench/X.py ...` (any program whose name is python or python3,
  e.g. `.venv/bin/python`): the script exists and every `--flag` appears in
  its `--help`, run with VENV_PYTHON and PYTHONPATH=BUILD_DIR/python;
- anything else (`bash tests/gpu/run.sh ...`): the file it runs exists.

`build/default` in a command stands for BUILD_DIR; a program in another build
folder (`./build/bin/pstar-bench`) is reported wrong, since that is not where
the build puts it.  Leading `NAME=value` assignments and a
`for ...; do CMD; done` loop around the command are allowed.

Commands are checked from the source root: the folder above BENCHMARKS_MD's
docs/ folder, or the current directory for a copy kept elsewhere.

Usage: check_benchmark_commands.py BENCHMARKS_MD BUILD_DIR VENV_PYTHON
Prints one line per row; exits 1 if any row fails (or the table has no rows),
0 otherwise.
"""
import os
import re
import shlex
import subprocess
import sys

TOOLS = ("pstar-bench", "pstar-plan")


def table_rows(md_path, heading="## Current figures"):
    lines = open(md_path, encoding="utf-8").read().splitlines()
    try:
        start = lines.index(heading)
    except ValueError:
        return None
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue  # the separator
        rows.append(cells)
    return rows[1:]  # the first row is the header


def command_of(cells):
    spans = re.findall(r"`([^`]+)`", cells[-1])
    return spans[-1] if spans else None


def help_text(argv, env, cwd, cache):
    key = tuple(argv)
    if key not in cache:
        try:
            r = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=180)
            cache[key] = (r.returncode, r.stdout)
        except (OSError, subprocess.TimeoutExpired) as e:
            cache[key] = (None, str(e))
    return cache[key]


def flags_of(words):
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2]


def missing_flags(flags, text):
    return [f for f in flags if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text)]


def subcommands(text):
    """The names listed under "Subcommands:" in CLI11's help."""
    out, inside = set(), False
    for line in text.splitlines():
        if line.strip() == "Subcommands:":
            inside = True
        elif inside and line.strip():
            out.add(line.split()[0])
        elif inside:
            break
    return out


def check(cmd, root, build_dir, venv_python, cache):
    """Returns None when the command exists as written, else what is wrong."""
    loop = re.fullmatch(r"for [^;]+; do (.+); done", cmd.strip())
    if loop:
        cmd = loop.group(1)
    try:
        words = shlex.split(cmd)
    except ValueError as e:
        return f"cannot split the command: {e}"
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]
    if not words:
        return "no program in the command"
    program = words[0]
    env = dict(os.environ, PYTHONPATH=os.path.join(build_dir, "python"))

    name = os.path.basename(program)
    if name in TOOLS:
        folder = os.path.dirname(program)
        if folder not in ("", "build/default/bin", "./build/default/bin"):
            return f"{program}: the build puts {name} in build/default/bin, not {folder}"
        exe = os.path.join(build_dir, "bin", name)
        if not os.access(exe, os.X_OK):
            return f"{exe} does not exist (is the build complete?)"
        args = words[1:]
        if name == "pstar-bench":
            if not args or args[0].startswith("-"):
                return "pstar-bench needs a subcommand"
            rc, top = help_text([exe, "--help"], env, root, cache)
            subs = subcommands(top)
            if args[0] not in subs:
                return f"pstar-bench has no subcommand '{args[0]}' (it has: {', '.join(sorted(subs))})"
            rc, text = help_text([exe, args[0], "--help"], env, root, cache)
            what = f"pstar-bench {args[0]} --help"
        else:
            rc, text = help_text([exe, "--help"], env, root, cache)
            what = "pstar-plan --help"
        if rc != 0:
            return f"{what} failed (exit {rc}): {text.strip()[-300:]}"
        missing = missing_flags(flags_of(args), text)
        return f"not in {what}: {' '.join(missing)}" if missing else None

    if re.fullmatch(r"python3?(\.\d+)?", name):
        if len(words) < 2 or words[1].startswith("-"):
            return f"{program} is not given a script"
        script = words[1]
        if not os.path.isfile(os.path.join(root, script)):
            return f"{script} does not exist"
        rc, text = help_text([venv_python, script, "--help"], env, root, cache)
        if rc != 0:
            return f"{script} --help failed (exit {rc}): {text.strip()[-300:]}"
        missing = missing_flags(flags_of(words[2:]), text)
        return f"not in {script} --help: {' '.join(missing)}" if missing else None

    if name in ("bash", "sh") and len(words) > 1:
        program = words[1]
    path = program.replace("build/default", os.path.relpath(build_dir, root), 1)
    if not os.path.isfile(os.path.join(root, path)):
        return f"{program} does not exist"
    return None


def main():
    if len(sys.argv) != 4:
        print(next(line for line in __doc__.splitlines() if line.startswith("Usage:")), file=sys.stderr)
        return 2
    md, build_dir, venv_python = sys.argv[1:4]
    # The commands are written from the source root: the folder above docs/
    # (a copy of the page elsewhere is checked from the current directory).
    docs = os.path.dirname(os.path.abspath(md))
    root = os.path.dirname(docs) if os.path.basename(docs) == "docs" else os.getcwd()
    build_dir = os.path.abspath(build_dir)
    rows = table_rows(md)
    if not rows:
        print(f"FAIL: no '## Current figures' table with rows in {md}")
        return 1
    cache, failed = {}, 0
    for cells in rows:
        label = cells[0]
        cmd = command_of(cells)
        problem = "no backticked command in the last cell" if cmd is None else check(
            cmd, root, build_dir, venv_python, cache)
        if problem:
            failed += 1
            print(f"FAIL {label}: {problem}  [{cmd}]")
        else:
            print(f"ok   {label}: {cmd}")
    print(f"{len(rows) - failed} of {len(rows)} rows ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
