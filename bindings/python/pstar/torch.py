"""pstar.torch: the parameters of a torch.nn.Module in libpstar chunks.

    model = MyModel()
    pm = pstar.torch.attach(model, compute_dtype="f32", device_capacity_bytes=...)
    for x, y in data:
        with pm.train_iteration():
            loss = loss_fn(model(x), y)
            loss.backward()
            pm.step()              # libpstar's AdamW; ends the iteration

How it works, at the tensor level (no module hooks, so it sees every use):

- Each parameter becomes a ``PstarParameter`` (an nn.Parameter subclass)
  whose own storage is empty; its values live in the engine.  Any torch
  function that receives it (``F.linear(x, self.weight)``, ``w.t()``,
  ``emb.weight @ h.T`` in a tied head, a parameter used outside its module)
  goes through ``__torch_function__``: the parameter is acquired (FORWARD,
  or RECOMPUTE inside a backward pass: activation checkpointing), a zero-copy
  tensor of the chunk memory (DLPack) stands in for it in the call, and it
  is released right after.  Metadata (shape, dtype, device...) is answered
  without acquiring.
- The stand-in comes out of a small autograd Function per use, so autograd
  calls back once per use in backward: there the gradient is written to the
  engine (pstar_grad_write) between a BACKWARD acquire and its release.
  Tied weights and modules called twice make several uses: the engine adds
  their gradients.
- Saved tensors: a pstar.torch iteration installs saved-tensor hooks, so an
  op that saves the stand-in for backward saves a handle instead; when
  backward needs it, the parameter is acquired (BACKWARD) and a fresh
  zero-copy tensor is returned.  The chunk is thus free to move between
  forward and backward, as the engine decides.
- A result that aliases chunk memory (``w.t()`` returned to the caller) is
  copied before the release, so no tensor outlives its acquire.  Inside a
  checkpoint's recomputation, the stand-in is a copy too (the recomputed
  graph keeps it until its backward runs).

Not supported (and refused or documented): in-place writes to parameters
(``p.add_()``; use ``ParameterModel.write``), ``torch.compile``, autocast
(the compute dtype is the engine's), sparse or complex parameters,
parameters on another device than the engine's, DataParallel/DDP wrappers
(the engine shards by itself), optimizers other than the engine's AdamW.
"""
import contextlib
import gc

import torch

from ._engine import Engine, Options
from ._errors import InvalidStateError, check
from . import capi as _c

_TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
_ENGINE_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# Tensor attributes and methods that read metadata only: answered from the
# registered shape and the engine's dtype and device, without an acquire.
_METADATA = {
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.__len__, torch.Tensor.stride,
    torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__, torch.Tensor.device.__get__,
    torch.Tensor.requires_grad.__get__, torch.Tensor.is_leaf.__get__, torch.Tensor.grad.__get__,
    torch.Tensor.ndim.__get__, torch.Tensor.is_cuda.__get__, torch.Tensor.layout.__get__,
    torch.Tensor.data.__get__, torch.Tensor.grad_fn.__get__, torch.Tensor.__hash__,
}


class PstarParameter(torch.nn.Parameter):
    """A parameter whose values live in a libpstar chunk (see the module doc)."""

    _pstar = None  # the _Slot of this parameter

    def __new__(cls, data, slot):
        p = torch.Tensor._make_subclass(cls, data, data.requires_grad)
        p._pstar = slot
        return p

    def __repr__(self):
        return f"PstarParameter(name={self._pstar.name!r}, shape={tuple(self._pstar.shape)})"

    def __deepcopy__(self, memo):
        raise InvalidStateError(_c.PSTAR_ERR_UNSUPPORTED, "PSTAR_ERR_UNSUPPORTED",
                                "a PstarParameter lives in an engine: read it with ParameterModel.state_dict()")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        slots = []
        for a in _flatten((args, kwargs)):
            if isinstance(a, PstarParameter) and all(s is not a._pstar for s in slots):
                slots.append(a._pstar)
        if not slots:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        if func in _METADATA:
            return slots[0].model._metadata(func, slots[0], args, kwargs)
        return slots[0].model._call(func, slots, args, kwargs)


def _replace(obj, subst):
    if isinstance(obj, PstarParameter):
        return subst[id(obj._pstar)]
    if isinstance(obj, list):
        return [_replace(o, subst) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_replace(o, subst) for o in obj)
    if isinstance(obj, dict):
        return {k: _replace(v, subst) for k, v in obj.items()}
    return obj


class _Slot:
    """Bookkeeping of one parameter: its engine Param and open views."""

    def __init__(self, model, name, param, shape, requires_grad):
        self.model = model
        self.name = name
        self.param = param
        self.shape = torch.Size(shape)
        self.requires_grad = requires_grad
        self.held = None        # the View while acquired
        self.held_count = 0     # uses sharing it
        self.forward_uses = 0
        self.backward_uses = 0


class _Use(torch.autograd.Function):
    """One use of a parameter: forward hands out the chunk tensor, backward
    writes this use's gradient to the engine."""

    @staticmethod
    def forward(ctx, anchor, tensor, slot):
        ctx.slot = slot
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.slot.model._backward_use(ctx.slot, grad)
        return None, None, None


class _RecomputedUse(torch.autograd.Function):
    """A use inside a checkpoint's recomputation (see _call)."""

    @staticmethod
    def forward(ctx, anchor, tensor):
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        return None, None


class _Packed:
    """A saved stand-in: the slot and the view's geometry in the chunk."""

    __slots__ = ("slot", "size", "stride", "offset")

    def __init__(self, slot, t):
        self.slot = slot
        self.size = t.size()
        self.stride = t.stride()
        self.offset = t.storage_offset()


class ParameterModel:
    """A module whose parameters live in a libpstar engine."""

    def __init__(self, module: torch.nn.Module, engine: Engine):
        self.module = module
        self.engine = engine
        self.dtype = _TORCH_DTYPES[engine.compute_dtype]
        self.device = torch.device("cpu") if engine.device == "emulated" else torch.device(
            "cuda", engine.options.device_ordinal)
        self.slots = []
        self._live = {}  # storage address of a held view -> slot (while acquired in forward)
        self._in_iteration = False
        self._hooks = None

    # -- setup -------------------------------------------------------------
    def _adopt(self):
        seen = {}
        for mod_name, mod in self.module.named_modules():
            for pname, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) in seen:  # tied: the same PstarParameter
                    mod._parameters[pname] = seen[id(p)]
                    continue
                if p.is_sparse or p.is_complex():
                    raise ValueError(f"{mod_name}.{pname}: sparse and complex parameters are not supported")
                full = f"{mod_name}.{pname}" if mod_name else pname
                param = self.engine.register(full, tuple(p.shape) or (1,), frozen=not p.requires_grad)
                slot = _Slot(self, full, param, p.shape, p.requires_grad)
                slot.initial = p.detach().to("cpu", torch.float32).contiguous()
                self.slots.append(slot)
                placeholder = torch.empty(0, dtype=self.dtype, device=self.device)
                placeholder.requires_grad_(p.requires_grad)
                new = PstarParameter(placeholder, slot)
                seen[id(p)] = new
                mod._parameters[pname] = new
        self.engine.build()
        for slot in self.slots:
            self.engine.write(slot.param, slot.initial.numpy().reshape(-1))
            del slot.initial

    # -- iterations ---------------------------------------------------------
    @contextlib.contextmanager
    def train_iteration(self):
        """A TRAIN iteration: forward, backward and step() inside."""
        self.engine_iteration_begin()
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self

    @contextlib.contextmanager
    def eval_iteration(self):
        """An EVAL iteration (forward only, no autograd graph)."""
        check(_c.pstar_iteration_begin(self.engine._handle(), _c.PSTAR_ITERATION_EVAL), "pstar_iteration_begin")
        self._in_iteration = True
        try:
            with torch.no_grad():
                yield self
        finally:
            self._in_iteration = False
            check(_c.pstar_iteration_end(self.engine._handle()), "pstar_iteration_end")

    def engine_iteration_begin(self):
        check(_c.pstar_iteration_begin(self.engine._handle(), _c.PSTAR_ITERATION_TRAIN), "pstar_iteration_begin")
        self._in_iteration = True
        for s in self.slots:
            s.forward_uses = s.backward_uses = 0

    def step(self):
        """Ends the TRAIN iteration with the engine's AdamW."""
        for s in self.slots:
            # Uses whose backward never ran (frozen parameters, a parameter
            # whose gradient was not needed): one BACKWARD use each, so that
            # the engine sees every use ended.
            while s.backward_uses < s.forward_uses:
                self._acquire(s, "backward")
                self._release(s)
                s.backward_uses += 1
            while s.held is not None:
                self._release(s)
        result = self.engine.step()
        self._in_iteration = False
        return result

    # -- acquire / release -------------------------------------------------------
    def _acquire(self, slot, stage):
        if slot.held is None:
            slot.held = self.engine.acquire(slot.param, stage, writable=stage != "forward")
            slot.held_count = 0
        slot.held_count += 1
        t = torch.from_dlpack(slot.held)
        return t.view(slot.shape) if slot.shape else t.view(())

    def _release(self, slot):
        slot.held_count -= 1
        if slot.held_count <= 0 and slot.held is not None:
            view, slot.held = slot.held, None
            slot.held_count = 0
            if view._exports:  # DLPack tensors in reference cycles: collect them first
                gc.collect()
            view.release()

    # -- the interception -------------------------------------------------------
    def _metadata(self, func, slot, args, kwargs):
        stand_in = torch.empty(slot.shape, dtype=self.dtype, device="meta")
        stand_in.requires_grad_(slot.requires_grad)
        if func is torch.Tensor.device.__get__:
            return self.device
        if func is torch.Tensor.is_cuda.__get__:
            return self.device.type == "cuda"
        if func is torch.Tensor.grad.__get__:
            return None
        if func is torch.Tensor.grad_fn.__get__:
            return None
        if func is torch.Tensor.data.__get__:
            raise InvalidStateError(_c.PSTAR_ERR_UNSUPPORTED, "PSTAR_ERR_UNSUPPORTED",
                                    f"{slot.name}: .data of a PstarParameter: read it with ParameterModel.read()")
        if func is torch.Tensor.__hash__:
            return object.__hash__(args[0])
        args = tuple(stand_in if isinstance(a, PstarParameter) else a for a in args)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    def _call(self, func, slots, args, kwargs):
        if not self._in_iteration:
            raise InvalidStateError(_c.PSTAR_ERR_INVALID_STATE, "PSTAR_ERR_INVALID_STATE",
                                    f"{slots[0].name} used outside a pstar.torch iteration "
                                    "(use train_iteration() or eval_iteration())")
        in_backward = torch._C._current_autograd_node() is not None
        stage = "recompute" if in_backward else "forward"
        subst = {}
        out = None
        try:
            for slot in slots:
                t = self._acquire(slot, stage)
                if in_backward:
                    # A checkpoint's recomputation keeps what it saves until
                    # that backward runs: hand it a copy, not chunk memory,
                    # through a Function of the same shape as in forward (so
                    # the ops save the same tensors) whose backward is never
                    # run (the original forward's graph is the one walked).
                    t = t.clone()
                    if slot.requires_grad and torch.is_grad_enabled():
                        anchor = args_anchor((args, kwargs), slot)
                        with torch._C.DisableTorchFunctionSubclass():
                            t = _RecomputedUse.apply(anchor, t)
                elif torch.is_grad_enabled():
                    # A use autograd may come back to: what the op saves of
                    # it is packed into a handle (_pack).
                    slot.forward_uses += 1
                    self._live[slot.held.address] = slot  # the storage of t starts there
                    if slot.requires_grad:
                        anchor = args_anchor((args, kwargs), slot)
                        with torch._C.DisableTorchFunctionSubclass():
                            t = _Use.apply(anchor, t, slot)
                subst[id(slot)] = t
            t = None
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*_replace(args, subst), **_replace(kwargs, subst))
            out = self._detach_aliases(out, slots)
        finally:
            # No tensor of chunk memory may outlive the release.
            subst.clear()
            t = None
            for slot in slots:
                self._live = {k: v for k, v in self._live.items() if v is not slot}
                self._release(slot)
        return out

    def _detach_aliases(self, out, slots):
        # A result sharing chunk memory would outlive the release: copy it.
        # (The held views' addresses are their tensors' storage addresses.)
        ptrs = {s.held.address for s in slots if s.held is not None}
        def fix(o):
            if isinstance(o, torch.Tensor) and not isinstance(o, PstarParameter) and o.layout == torch.strided:
                try:
                    if o.untyped_storage().data_ptr() in ptrs:
                        return o.clone()
                except RuntimeError:
                    return o
            if isinstance(o, tuple):
                return tuple(fix(x) for x in o)
            if isinstance(o, list):
                return [fix(x) for x in o]
            return o
        return fix(out) if ptrs else out

    # -- backward -----------------------------------------------------------------
    def _pack(self, t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device == self.device:
            try:
                slot = self._live.get(t.untyped_storage().data_ptr())
            except RuntimeError:
                slot = None
            if slot is not None:
                return _Packed(slot, t)
        return t

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        slot = packed.slot
        base = self._acquire(slot, "backward")
        if slot.requires_grad:
            # Released by this use's _Use.backward, after the gradient.
            slot.unpacked = getattr(slot, "unpacked", 0) + 1
        else:
            # Frozen: no gradient comes; held until step() releases it.
            slot.backward_uses += 1
        return base.as_strided(packed.size, packed.stride, packed.offset)

    def _backward_use(self, slot, grad):
        # This use's gradient; the acquire from unpack (if any) is reused.
        reuse = getattr(slot, "unpacked", 0) > 0
        if reuse:
            slot.unpacked -= 1
        else:
            self._acquire(slot, "backward")
        g = grad.detach().to(torch.float32).contiguous()
        if g.device.type == "cpu":
            self.engine.grad_write(slot.param, g.numpy().reshape(-1))
        else:
            check(_c.pstar_grad_write(self.engine._handle(), slot.param.id, g.data_ptr(), slot.param.numel,
                                      _c.PSTAR_DTYPE_F32, _c.PSTAR_MEM_DEVICE, None), "pstar_grad_write")
        slot.backward_uses += 1
        self._release(slot)

    # -- values ------------------------------------------------------------------
    def read(self, name_or_param) -> torch.Tensor:
        """A parameter's fp32 values (a copy), by name or PstarParameter."""
        slot = name_or_param._pstar if isinstance(name_or_param, PstarParameter) else self._slot(name_or_param)
        return torch.from_numpy(self.engine.read(slot.param)).reshape(slot.shape)

    def write(self, name_or_param, values: torch.Tensor):
        slot = name_or_param._pstar if isinstance(name_or_param, PstarParameter) else self._slot(name_or_param)
        self.engine.write(slot.param, values.detach().to("cpu", torch.float32).contiguous().numpy().reshape(-1))

    def state_dict(self):
        """fp32 copies of every parameter, by name."""
        return {s.name: self.read(s.name) for s in self.slots}

    def _slot(self, name):
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(name)


def args_anchor(args, slot):
    for a in _flatten(args):
        if isinstance(a, PstarParameter) and a._pstar is slot:
            return a
    raise AssertionError("the parameter is not among the arguments")


def _flatten(obj):
    if isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flatten(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flatten(o)
    else:
        yield obj


def attach(module: torch.nn.Module, options: Options = None, **fields) -> ParameterModel:
    """Moves the module's parameters into a new engine (registered in the
    module's parameter order; the compute dtype is the engine's) and returns
    the ParameterModel that runs its iterations."""
    engine = Engine(options, **fields) if options is not None else Engine(**fields)
    pm = ParameterModel(module, engine)
    pm._adopt()
    return pm
