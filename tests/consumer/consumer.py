"""A Python program outside the tree, run with the system's python3 against
the installed python3-pstar package: trains one parameter for a few steps
and checks that it moved."""
import numpy as np

import pstar

opts = pstar.Options(chunk_elems=1024)
with pstar.Engine(opts) as e:
    w = e.register("w", (256,))
    e.build()
    start = np.arange(256, dtype=np.float32) / 256
    e.write(w, start)
    for _ in range(3):
        with e.train_iteration():
            with e.acquire(w, "forward"):
                pass
            with e.acquire(w, "backward"):
                e.grad_write(w, np.ones(256, dtype=np.float32))
            e.step()
    after = e.read(w)
assert pstar.__file__.startswith("/usr/lib/python3/dist-packages/"), pstar.__file__
assert (after < start).all(), after
print(f"consumer.py: pstar {pstar.__version__} from {pstar.__file__}, 256 of 256 weights decreased")
