#!/usr/bin/env bash
# The README's quick start in one script.
#   packaging/quickstart.sh demo   install what is missing, build, run the demo
#   packaging/quickstart.sh test   install what is missing, build, run the tests
# Environment: PSTAR_PRESET (default: "default"), PSTAR_JOBS (default: nproc),
# PSTAR_VENV (the Python virtual environment; default: .venv in the tree).
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-demo}
preset=${PSTAR_PRESET:-default}
jobs=${PSTAR_JOBS:-$(nproc)}

case "$what" in
  demo|test) ;;
  *) echo "usage: $0 demo|test" >&2; exit 2 ;;
esac

bash packaging/setup-debian.sh
# The tests compare against PyTorch in the project's virtual environment.
export PSTAR_VENV=${PSTAR_VENV:-$PWD/.venv}
[ "$what" = test ] && bash packaging/setup-venv.sh
cmake --preset "$preset" -DPSTAR_VENV_PYTHON="$PSTAR_VENV/bin/python"
cmake --build --preset "$preset" -j "$jobs"

if [ "$what" = demo ]; then
  "build/$preset/bin/pstar-example-mlp" --steps 200
else
  ctest --preset "$preset" -j "$jobs"
fi
