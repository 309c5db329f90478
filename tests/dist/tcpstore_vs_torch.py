"""libpstar's TCPStore client against PyTorch's own TCPStore server.

    tcpstore_vs_torch.py PROBE

PROBE is tcpstore_probe (built beside this file).  Each check starts a
server with torch.distributed.TCPStore(is_master=True), the one torchrun's
agent serves, and reads back from Python what the probe wrote through
libpstar's client: key namespacing, counters shared with torch, waits, and
the errors of a handshake with servers that are not a TCPStore.
Exits 77 (skipped) when torch is not importable.
"""
import socket
import subprocess
import sys
import threading
import time

try:
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"skipped: torch.distributed not importable ({e})")
    sys.exit(77)

PROBE = sys.argv[1]
PREFIX = "libpstar/attempt_0/"


def server(use_libuv=True):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=use_libuv)
    assert store.libuvBackend == use_libuv
    return store


def check_ops(use_libuv):
    """Both of PyTorch's server backends: libuv (the default) and the
    classic one (use_libuv=False, or TORCH_USE_LIBUV=0)."""
    store = server(use_libuv)
    store.set("py/greeting", "hello from torch")
    proc = subprocess.Popen([PROBE, "ops", "127.0.0.1", str(store.port), PREFIX],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("waiting"):
            # What libpstar wrote, read by torch under the prefix.
            assert store.get(PREFIX + "k") == b"from-libpstar", store.get(PREFIX + "k")
            assert store.get(PREFIX + "ctr") == b"3", store.get(PREFIX + "ctr")
            assert store.add(PREFIX + "ctr", 10) == 13
            # Nothing libpstar wrote lands outside its prefix.
            assert not store.check(["k"]) and not store.check(["ctr"])
            time.sleep(0.2)
            store.set(PREFIX + "late", "set by torch")
    rc = proc.wait(timeout=60)
    out = "\n".join(lines)
    assert rc == 0, out
    expected = [
        "get py/greeting hello from torch",
        "set k",
        "add ctr 5 -> 5",
        "add ctr -2 -> 3",
        "check k 1 missing 0",
        "wait missing: PSTAR_ERR_COMM",
        "get empty size 0",
        "waiting",
        "got late set by torch",
        "erase k 1 then 0",
        "done",
    ]
    assert lines == expected, out
    assert store.get(PREFIX + "ctr") == b"13"
    assert not store.check([PREFIX + "k"])
    backend = "libuv" if use_libuv else "classic"
    print(f"ops ({backend} server): every step as expected; torch reads libpstar's keys under {PREFIX}")


def listening_socket(behaviour):
    """A loopback server that accepts one connection and then closes it
    ('close') or stays silent ('silent')."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    held = []

    def serve():
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            if behaviour == "close":
                conn.recv(64)
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    return lsock, held


def probe_connect(port):
    r = subprocess.run([PROBE, "connect", "127.0.0.1", str(port)], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def check_handshakes():
    store = server()
    rc, out = probe_connect(store.port)
    assert rc == 0 and out.strip() == "ok", out

    lsock, _ = listening_socket("close")
    rc, out = probe_connect(lsock.getsockname()[1])
    assert rc == 1 and "PSTAR_ERR_COMM" in out and "not a c10d TCPStore" in out and "0x3c85f7ce" in out, out
    print("a server that closes:", out.strip())

    lsock2, _ = listening_socket("silent")
    t0 = time.monotonic()
    rc, out = probe_connect(lsock2.getsockname()[1])
    assert rc == 1 and "did not answer the handshake" in out and "PyTorch" in out, out
    print(f"a silent server ({time.monotonic() - t0:.1f} s):", out.strip())

    r = subprocess.run([PROBE, "connect-libpstar-server"], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "libpstar store server" in out and "protocol version" in out, out
    print("libpstar's own store server:", out.strip())


check_ops(use_libuv=True)
check_ops(use_libuv=False)
check_handshakes()
print("tcpstore_vs_torch: all checks passed")
