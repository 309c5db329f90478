#!/usr/bin/env python3
"""pstar and torch imported in either order in one interpreter, then both used.

Usage: import_order.py pstar-first|torch-first     (PYTHONPATH=<build>/python)

ctest starts each order in a fresh interpreter.  libpstar.so once linked the
CUDA toolkit's libnccl.so.2; PyTorch's wheels bring a newer one under the same
soname, and the dynamic loader serves the first one loaded to both, so
`import pstar` before `import torch` broke torch (`libtorch_cuda.so: undefined
symbol: ncclCommResume`).  libpstar now loads NCCL only when a CUDA group
forms, preferring the one already in the process (docs/python.md).

Checks, with no GPU needed: importing pstar maps no libnccl; the second import
succeeds; a pstar engine on the emulated device trains a step (its data made
by torch); torch reaches its CUDA and NCCL libraries (torch.cuda.is_available,
torch.distributed.is_nccl_available, torch.cuda.nccl.version); and at the end
the process holds at most one libnccl file.

Exit 77 (skipped) without torch in this interpreter.
"""
import importlib.util
import sys

ORDERS = ("pstar-first", "torch-first")


def nccl_files():
    """The libnccl files mapped into this process."""
    files = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "libnccl" in fields[-1].rsplit("/", 1)[-1]:
                files.add(fields[-1])
    return sorted(files)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def import_torch():
    try:
        import torch
    except Exception as e:  # the pre-fix failure: ImportError, undefined symbol ncclCommResume
        fail(f"import torch after import pstar: {type(e).__name__}: {e}")
    return torch


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ORDERS:
        print(f"usage: {sys.argv[0]} {'|'.join(ORDERS)}")
        return 2
    order = sys.argv[1]
    if importlib.util.find_spec("torch") is None:
        print("skipped: torch is not installed in this interpreter (packaging/setup-venv.sh)")
        return 77

    if order == "pstar-first":
        import pstar
        early = nccl_files()
        if early:  # reported after torch's import, which shows what it breaks
            print(f"FAIL: import pstar loaded NCCL ({', '.join(early)}); it must wait for a CUDA group")
        else:
            print("import pstar: no libnccl mapped")
        torch = import_torch()
        if early:
            fail("import pstar loaded NCCL")
    else:
        import torch
        import pstar
    print(f"imported in the order {order}: torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"pstar {pstar.__version__}")

    # pstar: one training step on the emulated device, with data from torch.
    n = 256
    start = torch.linspace(-1.0, 1.0, n, dtype=torch.float32)
    grad = torch.full((n,), 0.5, dtype=torch.float32)
    with pstar.Engine(device="emulated", chunk_elems=1024, compute_dtype="f32", lr=1e-2) as e:
        w = e.register("w", (n,))
        e.build()
        e.write(w, start.numpy())
        with e.train_iteration():
            with e.acquire(w, "forward"):
                pass
            with e.acquire(w, "backward"):
                e.grad_write(w, grad.numpy())
            result = e.step()
        after = torch.from_numpy(e.read(w))
    if result.step != 1 or result.skipped:
        fail(f"pstar step: {result}")
    if not bool((after < start).all()):
        fail("pstar step with a positive gradient did not lower every weight")
    print(f"pstar: one step on the emulated device (grad norm {result.grad_norm:.4f})")

    # torch: its CUDA runtime and NCCL, as far as they go without a GPU.
    available = torch.cuda.is_available()
    print(f"torch.cuda.is_available() = {available}, device_count() = {torch.cuda.device_count()}")
    import torch.distributed as dist
    if torch.version.cuda is not None:
        if not dist.is_available() or not dist.is_nccl_available():
            fail("torch.distributed.is_nccl_available() is False in a CUDA build of torch")
        version = torch.cuda.nccl.version()
        print(f"torch.distributed.is_nccl_available() = True, torch.cuda.nccl.version() = {version}")
    else:
        print("torch is a CPU build: no NCCL to reach")
    if available:
        x = torch.arange(8, dtype=torch.float32, device="cuda")
        if float(x.sum().item()) != 28.0:
            fail("a sum on the CUDA device")
        print("torch: a sum on the CUDA device")

    loaded = nccl_files()
    print(f"libnccl files mapped: {loaded or 'none'}")
    if len(loaded) > 1:
        fail(f"two NCCL libraries in one process: {loaded}")
    print(f"ok: {order}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
