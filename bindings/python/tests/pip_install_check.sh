#!/usr/bin/env bash
# `pip install bindings/python` into a fresh folder, then imports the
# installed package outside the build tree and trains one step with it.
# Usage: pip_install_check.sh PYTHON WORK_DIR.  Exit 77 without
# scikit-build-core in that interpreter (packaging/setup-venv.sh installs it).
set -uo pipefail
py=$1 work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
if ! "$py" -c 'import scikit_build_core' 2> /dev/null; then
  echo "skipped: scikit-build-core is not installed for $py"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
# No build isolation: scikit-build-core from the venv (no registry needed).
"$py" -m pip install -q --no-build-isolation --no-deps --target "$work/site" "$here" || exit 1
cd "$work"
PYTHONPATH="$work/site" "$py" - <<'PY' || exit 1
import numpy as np
import pstar
assert pstar.__file__.startswith(__import__("os").getcwd()), pstar.__file__
with pstar.Engine(device="emulated", compute_dtype="f32", chunk_elems=256) as e:
    w = e.register("w", (16,))
    e.build()
    e.write(w, np.zeros(16, np.float32))
    with e.train_iteration():
        with e.acquire(w, "forward"):
            pass
        with e.acquire(w, "backward"):
            e.grad_write(w, np.ones(16, np.float32))
        r = e.step()
    assert r.params_updated == 1 and (e.read(w) < 0).all()
print("installed package", pstar.__version__, "from", pstar.__file__, ": trained one step")
PY
