"""The Python binding: errors, values, training, the buffer protocol, DLPack."""
import ctypes
import gc

import numpy as np
import pytest

# PyTorch when installed (the DLPack tests use it).  Either import order
# works: libpstar loads NCCL only when a CUDA group forms (docs/python.md;
# tests/torch/import_order.py tests both orders).
try:
    import torch  # noqa: F401
except ImportError:
    pass

import pstar  # noqa: E402
from pstar import _dlpack


def small_engine(**fields):
    fields.setdefault("device", "emulated")
    fields.setdefault("chunk_elems", 1024)
    fields.setdefault("compute_dtype", "f32")
    return pstar.Engine(**fields)


# -- the C API through SWIG ---------------------------------------------------

def test_version_and_constants():
    assert pstar.__version__ == pstar.capi.pstar_version_string()
    assert pstar.capi.PSTAR_OK == 0
    assert pstar.capi.PSTAR_ERR_BUSY == -6
    assert pstar.capi.pstar_status_name(pstar.capi.PSTAR_ERR_BUSY) == "PSTAR_ERR_BUSY"
    # A code the library does not know yet: a generic name, no crash.
    assert pstar.capi.pstar_status_name(-999) == "PSTAR_ERR_UNKNOWN"
    assert not hasattr(pstar.capi, "PSTAR_STATUS_FORCE_32BIT_")


def test_unknown_status_becomes_a_plain_pstar_error():
    err = pstar.error_for(-999, "somewhere", "a future code")
    assert type(err) is pstar.PstarError
    assert err.status == -999 and err.status_name == "PSTAR_ERR_UNKNOWN"


# -- errors ---------------------------------------------------------------------

def test_register_after_build_raises_invalid_state_with_the_library_message():
    with small_engine() as e:
        e.register("w", (8,))
        e.build()
        with pytest.raises(pstar.InvalidStateError) as info:
            e.register("late", (8,))
    err = info.value
    assert err.status == pstar.capi.PSTAR_ERR_INVALID_STATE
    assert err.status_name == "PSTAR_ERR_INVALID_STATE"
    assert err.call == "pstar_param_register"
    assert "build" in err.message


def test_each_wrong_call_raises_its_typed_error():
    with small_engine() as e:
        w = e.register("w", (4, 4))
        with pytest.raises(pstar.InvalidArgumentError):
            e.register("w", (4,))  # the name is taken
        with pytest.raises(pstar.InvalidArgumentError):
            e.register("bad", (-1, 4))
        e.build()
        with pytest.raises(pstar.NotFoundError):
            e.param("nope")
        with pytest.raises(pstar.InvalidArgumentError, match="bytes given"):
            e.write(w, np.zeros(15, np.float32))
        with pytest.raises(pstar.InvalidArgumentError, match="name the dtype"):
            e.write(w, np.zeros(16, np.int32))
        with pytest.raises(pstar.InvalidStateError):
            e.acquire(w, "forward")  # outside an iteration? no: legal; acquire twice is not
            e.acquire(w, "forward")
    with pytest.raises(TypeError):
        pstar.Options(no_such_field=1)
    with pytest.raises(pstar.InvalidArgumentError):
        pstar.Options(device="tpu")


def test_bad_options_fail_engine_creation():
    with pytest.raises(pstar.InvalidArgumentError) as info:
        pstar.Engine(device="emulated", beta1=1.5)
    assert "beta1" in info.value.message


def test_a_closed_engine_answers_invalid_handle_from_the_library():
    e = small_engine()
    e.register("w", (4,))
    e.close()
    e.close()  # idempotent
    with pytest.raises(pstar.InvalidHandleError) as info:
        e.build()
    assert info.value.call == "pstar_engine_build"


def test_out_of_memory_on_the_host_tier_is_typed_and_the_engine_stays_usable():
    with small_engine(host_capacity_bytes=64 << 10) as e:
        e.register("big", (1 << 20,))
        with pytest.raises(pstar.OutOfMemoryError):
            e.build()


# -- values -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_write_then_read_round_trips_through_the_compute_dtype(dtype):
    with small_engine(compute_dtype=dtype) as e:
        w = e.register("w", (3, 5))
        e.build()
        values = (np.arange(15, dtype=np.float32).reshape(3, 5) - 7) / 8  # exact in every dtype
        e.write(w, values)
        np.testing.assert_array_equal(e.read(w), values)
        half = e.read(w, dtype="f16")
        assert half.dtype == np.float16
        np.testing.assert_array_equal(half.astype(np.float32), values)


# -- training ----------------------------------------------------------------

def train_regression(capacity, steps=60, **options):
    """Least squares y = x @ W_true with AdamW in libpstar; returns losses and stats."""
    rng = np.random.default_rng(3)
    layers = [rng.standard_normal((16, 16)).astype(np.float32) * 0.3 for _ in range(6)]
    x = rng.standard_normal((64, 16)).astype(np.float32)
    # A target the network can reach (its output is a tanh).
    y = np.tanh(x @ (rng.standard_normal((16, 16)).astype(np.float32) * 0.3))
    losses = []
    with small_engine(chunk_elems=256, device_capacity_bytes=capacity, lr=1e-2, weight_decay=0.0, **options) as e:
        ws = [e.register(f"w{i}", (16, 16)) for i in range(len(layers))]
        e.build()
        for w, v in zip(ws, layers):
            e.write(w, v)
        for _ in range(steps):
            with e.train_iteration():
                # Forward: every layer's weights read from the engine (zero-copy).
                acts = [x]
                for w in ws:
                    with e.acquire(w, "forward") as v:
                        acts.append(np.tanh(acts[-1] @ np.from_dlpack(v)))
                err = acts[-1] - y
                losses.append(float((err ** 2).mean()))
                grad = 2 * err / err.size
                for i in reversed(range(len(ws))):
                    with e.acquire(ws[i], "backward") as v:
                        wmat = np.from_dlpack(v)
                        dz = grad * (1 - acts[i + 1] ** 2)
                        e.grad_write(ws[i], np.ascontiguousarray(acts[i].T @ dz, dtype=np.float32))
                        grad = dz @ wmat.T
                        del wmat
                e.step()
        return losses, e.stats


def test_training_reduces_the_loss_while_chunks_move():
    # Six 1 KiB f32 chunks; the device holds two of them (and a gradient buffer).
    losses, stats = train_regression(capacity=2 * 1024 + 2 * 1024 + 512)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert stats["evictions"] > 0 and stats["moves_to_device"] > 6
    assert stats["steps"] == 60


def test_constrained_and_unlimited_runs_give_the_same_losses():
    tight, _ = train_regression(capacity=2 * 1024 + 2 * 1024 + 512, steps=15)
    free, _ = train_regression(capacity=0, steps=15)
    assert tight == free


def test_state_formats_train_in_fewer_host_bytes():
    # Adam's moments as bf16 or int8 codes: the loss still falls, constrained
    # and unlimited runs agree, and the host holds fewer bytes than with fp32.
    fp32_losses, fp32 = train_regression(capacity=0, steps=40)
    for name, saved_per_elem in (("bf16", 4), ("int8", 6)):
        losses, stats = train_regression(capacity=0, steps=40, state_format=name)
        assert losses[-1] < 0.5 * losses[0], (name, losses[::10])
        assert losses != fp32_losses  # the format is in effect
        tight, _ = train_regression(capacity=2 * 1024 + 2 * 1024 + 512, steps=40, state_format=name)
        assert tight == losses
        # Six chunks of 256 trainable elements; int8 keeps 1 byte per element
        # and list plus its block maxima (a float per 256, after the codes).
        saved = fp32["host_bytes"] - stats["host_bytes"]
        assert saved >= 6 * 256 * saved_per_elem - 6 * 2 * 64, (name, saved)
    with pytest.raises(pstar.InvalidArgumentError, match="state_format"):
        pstar.Options(state_format="fp8")


def test_bf16_masters_train_in_fewer_host_bytes():
    # bf16 masters (stochastic rounding) with int8 moments: the loss falls,
    # constrained and unlimited runs agree, reruns agree, and the host holds
    # 2 bytes per trainable element less than with fp32 masters.
    int8_losses, int8 = train_regression(capacity=0, steps=40, state_format="int8")
    losses, stats = train_regression(capacity=0, steps=40, state_format="int8", master_format="bf16", master_seed=5)
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert losses != int8_losses
    again, _ = train_regression(capacity=2 * 1024 + 2 * 1024 + 512, steps=40, state_format="int8",
                                master_format="bf16", master_seed=5)
    assert again == losses
    assert int8["host_bytes"] - stats["host_bytes"] == 6 * 256 * 2
    with pytest.raises(pstar.InvalidArgumentError, match="master_format"):
        pstar.Options(master_format="fp8")


# -- buffer protocol and DLPack -------------------------------------------------

def test_memoryview_is_zero_copy_and_read_only_unless_asked():
    with small_engine() as e:
        w = e.register("w", (2, 3))
        e.build()
        e.write(w, np.arange(6, dtype=np.float32).reshape(2, 3))
        with e.eval_iteration():
            with e.acquire(w) as v:
                mv = v.memoryview()
                assert mv.format == "f" and mv.shape == (2, 3) and mv.readonly
                arr = np.asarray(mv)
                assert arr.ctypes.data == v.address
                np.testing.assert_array_equal(arr, np.arange(6).reshape(2, 3))
                del arr, mv
            with e.acquire(w, writable=True) as v:
                assert not v.memoryview().readonly


def test_dlpack_to_numpy_is_zero_copy_and_exports_pin_the_view():
    with small_engine(compute_dtype="f16") as e:
        w = e.register("w", (4, 4))
        e.build()
        e.write(w, np.eye(4, dtype=np.float32))
        with e.eval_iteration():
            v = e.acquire(w)
            assert v.__dlpack_device__() == (_dlpack.KDL_CPU, 0)
            arr = np.from_dlpack(v)
            assert arr.dtype == np.float16 and arr.shape == (4, 4)
            assert arr.ctypes.data == v.address
            np.testing.assert_array_equal(arr, np.eye(4, dtype=np.float16))
            # The array still uses the memory: release is refused.
            with pytest.raises(pstar.BusyError) as info:
                v.release()
            assert info.value.status_name == "PSTAR_ERR_BUSY"
            with pytest.raises(pstar.BusyError):
                e.close()
            del arr
            gc.collect()
            v.release()
    assert _dlpack.live_exports() == 0


def capsule_name(capsule):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(capsule)


def test_versioned_capsule_when_the_consumer_asks_and_legacy_otherwise():
    with small_engine() as e:
        w = e.register("w", (8,))
        e.build()
        with e.eval_iteration():
            with e.acquire(w) as v:
                legacy = v.__dlpack__()
                versioned = v.__dlpack__(max_version=(1, 0))
                assert capsule_name(legacy) == b"dltensor"
                assert capsule_name(versioned) == b"dltensor_versioned"
                with pytest.raises(BufferError):
                    v.__dlpack__(copy=True)
                # Capsules no consumer took free themselves.
                del legacy, versioned
                gc.collect()
    assert _dlpack.live_exports() == 0


def test_dlpack_to_torch_in_bf16_is_zero_copy():
    torch = pytest.importorskip("torch")
    with small_engine(compute_dtype="bf16") as e:
        w = e.register("w", (3, 4))
        e.build()
        values = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
        e.write(w, values)
        with e.eval_iteration():
            with e.acquire(w, writable=True) as v:
                t = torch.from_dlpack(v)
                assert t.dtype == torch.bfloat16 and tuple(t.shape) == (3, 4)
                assert t.data_ptr() == v.address
                np.testing.assert_array_equal(t.float().numpy(), values)
                del t
                gc.collect()


# -- pinned masters ---------------------------------------------------------------

def test_a_pinned_master_is_zero_copy_and_refuses_a_step_that_would_update_it():
    with small_engine(compute_dtype="bf16") as e:
        w = e.register("w", (4, 8))
        e.build()
        values = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
        e.write(w, values)
        with e.pin(w) as m:
            arr = np.from_dlpack(m)
            assert arr.dtype == np.float32 and arr.ctypes.data == m.address
            np.testing.assert_array_equal(arr, values)  # fp32 master, not the bf16 copy
            assert m.memoryview().readonly
            with e.train_iteration():
                with e.acquire(w, "forward"):
                    pass
                with e.acquire(w, "backward"):
                    e.grad_write(w, np.ones((4, 8), np.float32))
                with pytest.raises(pstar.BusyError) as info:
                    e.step()
                assert "pinned" in info.value.message
                np.testing.assert_array_equal(arr, values)  # nothing changed
                with pytest.raises(pstar.BusyError):
                    m.unpin()  # the array still uses it
                del arr
                gc.collect()
                m.unpin()
                e.step()
        with e.pin(w) as m:
            assert not np.array_equal(np.asarray(m.memoryview()), values)
        with pytest.raises(pstar.InvalidStateError, match="not pinned"):
            pstar.check(pstar.capi.pstar_param_unpin(e._handle(), w.id), "pstar_param_unpin")


def test_a_frozen_parameter_cannot_be_pinned():
    with small_engine() as e:
        f = e.register("f", (4,), frozen=True)
        e.build()
        with pytest.raises(pstar.UnsupportedError, match="frozen"):
            e.pin(f)


# -- the log callback ----------------------------------------------------------------

def test_the_log_callback_receives_the_library_records():
    records = []
    pstar.set_log_callback(lambda level, message: records.append((level, message)), pstar.LOG_INFO)
    try:
        with small_engine() as e:
            e.register("w", (4,))
            e.build()
    finally:
        pstar.set_log_callback(None)
    assert any(level == pstar.LOG_INFO and "engine built" in message for level, message in records), records
    with pytest.raises(TypeError):
        pstar.set_log_callback(42)


def test_a_raising_log_callback_does_not_break_the_library():
    def bad(level, message):
        raise RuntimeError("callback failure")
    seen = []
    import sys
    old_hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: seen.append(unraisable.exc_value)
    pstar.set_log_callback(bad, pstar.LOG_INFO)
    try:
        with small_engine() as e:
            e.register("w", (4,))
            e.build()  # logs at info: the callback raises, the call succeeds
    finally:
        pstar.set_log_callback(None)
        sys.unraisablehook = old_hook
    assert any(isinstance(x, RuntimeError) for x in seen)


def test_calls_release_the_gil_so_other_threads_run():
    import threading
    import time
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1
            time.sleep(0)
    t = threading.Thread(target=spin)
    t.start()
    try:
        # A long C call: a step over a few MB of parameters.
        with small_engine(chunk_elems=1 << 20) as e:
            w = e.register("w", (1 << 20,))
            e.build()
            before = counter[0]
            for _ in range(3):
                with e.train_iteration():
                    with e.acquire(w, "forward"):
                        pass
                    with e.acquire(w, "backward"):
                        e.grad_write(w, np.ones(1 << 20, np.float32))
                    e.step()
            during = counter[0] - before
    finally:
        stop.set()
        t.join()
    assert during > 0


def test_a_writable_pin_reaches_the_compute_copy_at_unpin():
    with small_engine(compute_dtype="f16") as e:
        w = e.register("w", (8,))
        e.build()
        with e.pin(w, writable=True) as m:
            np.from_dlpack(m)[:] = 0.25          # through DLPack, writable
            m.memoryview()[0] = 1.5               # through the buffer protocol
            gc.collect()
        np.testing.assert_array_equal(e.read(w), [1.5] + [0.25] * 7)
        with e.eval_iteration():
            with e.acquire(w) as v:
                np.testing.assert_array_equal(np.from_dlpack(v).astype(np.float32), [1.5] + [0.25] * 7)


# -- checkpoints ------------------------------------------------------------------------

def test_checkpoint_round_trip_and_a_corrupted_one(tmp_path):
    def run(e, w, steps):
        for s in range(steps):
            with e.train_iteration():
                with e.acquire(w, "forward"):
                    pass
                with e.acquire(w, "backward"):
                    e.grad_write(w, np.full(64, 0.01 * (s + 1), np.float32))
                e.step()
    with small_engine(compute_dtype="bf16") as a:
        w = a.register("w", (64,))
        a.build()
        a.write(w, np.linspace(-1, 1, 64, dtype=np.float32))
        run(a, w, 3)
        a.save_checkpoint(tmp_path / "ck")
        run(a, w, 2)
        expected = a.read(w)
        a.export_safetensors(tmp_path / "w.safetensors")
    with small_engine(compute_dtype="bf16") as b:
        w = b.register("w", (64,))
        b.build()
        b.load_checkpoint(tmp_path / "ck")
        run(b, w, 2)
        np.testing.assert_array_equal(b.read(w), expected)
    latest = (tmp_path / "ck" / "LATEST").read_text().strip()
    (tmp_path / "ck" / latest / "masters.f32").write_bytes(b"\0" * 8)
    with small_engine(compute_dtype="bf16") as c:
        w = c.register("w", (64,))
        c.build()
        with pytest.raises(pstar.PstarIOError, match="masters.f32"):
            c.load_checkpoint(tmp_path / "ck")
    # The safetensors file: header length, JSON header, the fp32 data.
    header_len = int.from_bytes((tmp_path / "w.safetensors").read_bytes()[:8], "little")
    data = (tmp_path / "w.safetensors").read_bytes()[8 + header_len:]
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), expected)
