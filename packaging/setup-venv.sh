#!/usr/bin/env bash
# Creates (or completes) the project's Python virtual environment in .venv,
# with Debian's /usr/bin/python3 (the interpreter CMake is told about), and
# installs the Python packages the tests and benchmarks need from PyPI.
# Idempotent: packages already present are not reinstalled.  PyTorch's wheel
# is large; pip's cache is reused across runs.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PSTAR_PYTHON:-/usr/bin/python3}
venv=${PSTAR_VENV:-$PWD/.venv}
packages=(numpy torch torchvision transformers accelerate peft pytorch-lightning pytest tqdm matplotlib scikit-build-core)

if [ ! -x "$venv/bin/python" ]; then
  echo "setup-venv: creating $venv with $python"
  "$python" -m venv "$venv"
fi

missing=()
for p in "${packages[@]}"; do
  "$venv/bin/python" -m pip show -q "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-venv: installing ${missing[*]}"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}"
else
  echo "setup-venv: all ${#packages[@]} packages present"
fi
# bitsandbytes for the int8 Adam state pin (tests/optim/test_bnb_pin.py) and
# bench/adam_vs_bnb.py: pinned (its CPU path is what the pin compares with);
# it takes the torch already installed (torch>=2.4,<3), upgrading nothing.
"$venv/bin/python" -m pip install -q --disable-pip-version-check "bitsandbytes==0.50.2"
