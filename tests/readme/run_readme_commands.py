#!/usr/bin/env python3
"""Runs the README's commands for the other languages as written.

Reads the ```sh block that follows "From other languages" in README.md and
runs each command line in it from the source tree's root, one after the
other; a line's comment above it names the language.  Two substitutions
only, for where this build and its Python are: `build/default` becomes this
build's folder (relative to the root, as the README writes it), and
`.venv/bin/python` the Python of the project's virtual environment that
CMake was given (CI keeps its venv outside the tree).  Lines whose program
is not installed (julia: never installable here) are reported skipped and
do not count as run.  The Quick start's commands are not run here: they
are what CI itself runs (`.ci/run`).

Also, without running any benchmark:
- each ```python block of the README runs as a script with VENV_PYTHON
  and PYTHONPATH=BUILD_DIR/python, from the root;
- each command of the README's "## Headline figures" table (the last
  backticked span of a row's last cell) exists as written, checked as
  check_benchmark_commands.py checks docs/benchmarks.md's table (program
  or script, subcommand, every --flag against its --help).

Usage: run_readme_commands.py README BUILD_DIR VENV_PYTHON
Exit 0 when every command that could run succeeded and every figure's
command exists, 1 otherwise, 77 when no command could run.
"""
import os
import shlex
import shutil
import subprocess
import sys
import time

import check_benchmark_commands  # beside this file


def commands(readme):
    lines = open(readme, encoding="utf-8").read().splitlines()
    start = next(i for i, line in enumerate(lines) if "From other languages" in line)
    opening = next(i for i in range(start, len(lines)) if lines[i].startswith("```sh"))
    out, comment = [], ""
    for line in lines[opening + 1:]:
        if line.startswith("```"):
            break
        if line.startswith("#"):
            comment = line.lstrip("# ")
        elif line.strip():
            out.append((comment, line))
    return out


def python_blocks(readme):
    blocks, current = [], None
    for line in open(readme, encoding="utf-8").read().splitlines():
        if current is None and line.strip() == "```python":
            current = []
        elif current is not None and line.startswith("```"):
            blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def main():
    readme, build_dir, venv_python = sys.argv[1:4]
    root = os.path.dirname(os.path.abspath(readme))
    rel_build = os.path.relpath(os.path.abspath(build_dir), root)
    env = dict(os.environ, PWD=root)
    # What cargo builds stays in the build tree (the command line is the README's).
    env.setdefault("CARGO_TARGET_DIR", os.path.join(os.path.abspath(build_dir), "readme-cargo-target"))
    ran = failed = 0
    for comment, line in commands(readme):
        cmd = line.replace("build/default", rel_build).replace(".venv/bin/python", venv_python)
        words = shlex.split(cmd)
        program = next(w for w in words if "=" not in w or w.startswith("-"))
        if shutil.which(program) is None and not os.path.exists(os.path.join(root, program)):
            print(f"skipped ({program} not installed): {line}")
            continue
        t0 = time.monotonic()
        r = subprocess.run(cmd, shell=True, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
        ran += 1
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{status} in {time.monotonic() - t0:.1f} s: {line}  [{comment}]")
        if r.returncode != 0:
            failed += 1
            print(r.stdout[-3000:])
    print(f"{ran} README commands run, {failed} failed")

    for i, code in enumerate(python_blocks(readme), 1):
        t0 = time.monotonic()
        r = subprocess.run([venv_python, "-"], input=code, cwd=root, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=600,
                           env=dict(env, PYTHONPATH=os.path.join(os.path.abspath(build_dir), "python")))
        ran += 1
        status = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{status} in {time.monotonic() - t0:.1f} s: README python block {i}: {r.stdout.strip()[-200:]}")
        if r.returncode != 0:
            failed += 1
            print(r.stdout[-3000:])

    rows = check_benchmark_commands.table_rows(readme, "## Headline figures")
    if not rows:
        failed += 1
        print("FAILED: no '## Headline figures' table with rows in the README")
    cache = {}
    for cells in rows or []:
        cmd = check_benchmark_commands.command_of(cells)
        problem = "no backticked command in the last cell" if cmd is None else check_benchmark_commands.check(
            cmd, root, os.path.abspath(build_dir), venv_python, cache)
        print(f"{'FAILED' if problem else 'ok'}: figure's command exists: {cmd}" + (f": {problem}" if problem else ""))
        failed += bool(problem)

    print(f"{ran} README commands and blocks run, {failed} failed or missing")
    if ran == 0:
        sys.exit(77)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
