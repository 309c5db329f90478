"""Runs the binding's pytest suite; exit 77 (CTest's skip) without pytest or
NumPy in this interpreter, so that a missing tool is never a pass."""
import sys

try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print(f"skipped: {e.name} is not installed for {sys.executable} (packaging/setup-venv.sh)")
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
